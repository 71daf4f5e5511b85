"""Zero-touch start-up through the environment, for launchers you cannot change.

    export MEMEXPORTER_AUTOSTART=1
    export PYTHONPATH=$(python -m memexporter.bootstrap)${PYTHONPATH:+:$PYTHONPATH}
    torchrun --nproc_per_node=8 train.py

This directory holds a ``sitecustomize.py`` that Python imports at start-up. When
``MEMEXPORTER_AUTOSTART`` is set it calls ``memexporter.start()`` (reading the other
``MEMEXPORTER_*`` variables), except in the torchrun launcher itself, in multiprocessing
children and in the ``memexporter`` command. torchrun passes the environment on to its workers.
"""

from __future__ import annotations

from pathlib import Path


def path() -> str:
    """The directory to put on ``PYTHONPATH``."""
    return str(Path(__file__).resolve().parent)
