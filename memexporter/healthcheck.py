"""``python -m memexporter.healthcheck``, as the container image and the compose stack call it: ``memexporter.cli.healthcheck``."""

from memexporter.cli.healthcheck import main

if __name__ == "__main__":
    raise SystemExit(main())
