from memexporter.dashboards.cli import main

raise SystemExit(main())
