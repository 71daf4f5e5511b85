"""``python -m memexporter.bootstrap`` prints the directory to put on ``PYTHONPATH``."""

from memexporter.bootstrap import path

print(path())
