"""Collectors: one file each, pure. Each reads a ``Scrape`` and yields fresh metric families built
from the spec table; none keeps state between scrapes."""
