"""The landing page at ``/``: the live page (``live.html``: no CDN, no build step, plain SVG), its title
and the links to every endpoint filled in. It fetches ``/live.json`` (the job renders it: ``job/live.py``)
with a relative URL every few seconds, so it works behind TLS, basic auth and a path prefix."""

from __future__ import annotations

import html
from collections.abc import Iterable
from importlib import resources

LIVE_PATH = "/live.json"


def page(title: str, links: Iterable[tuple[str, str]]) -> bytes:
    """``live.html`` with the title and the endpoint links filled in."""
    items = "".join(
        f'<li><a href="{html.escape(href)}">/{html.escape(href)}</a>: {html.escape(text)}</li>' for href, text in links
    )
    text = resources.files("memexporter.serving").joinpath("live.html").read_text(encoding="utf-8")
    return text.replace("{{title}}", html.escape(title)).replace("{{links}}", items).encode()
