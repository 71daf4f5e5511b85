import sys

from memexporter.rules.cli import main

sys.exit(main())
