from memexporter.cli.dashboards import main

raise SystemExit(main())
