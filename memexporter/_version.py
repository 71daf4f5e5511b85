"""The package version: one place, read by the build (pyproject), the CLI, the build info and OTel."""

__version__ = "0.2.0"
