"""``python -m memexporter.rules``: the same as ``memexporter rules`` (``memexporter.cli.rules``)."""

import sys

from memexporter.cli.rules import main

sys.exit(main())
