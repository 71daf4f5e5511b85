"""``python -m memexporter``: the same as the ``memexporter`` command."""

from memexporter.cli import main

raise SystemExit(main())
