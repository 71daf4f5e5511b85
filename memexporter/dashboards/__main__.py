"""``python -m memexporter.dashboards [--check]``: write (or check) the checkout's
``grafana/dashboards/*.json`` (``memexporter.cli.dashboards``)."""

from memexporter.cli.dashboards import main

raise SystemExit(main())
