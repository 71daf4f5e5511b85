import sys

from memexporter.cli.rules import main

sys.exit(main())
