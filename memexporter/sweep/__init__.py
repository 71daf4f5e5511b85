"""``memexporter sweep``: what fits, before the job is launched.

Each configuration of a grid runs in a fresh child process with the exporter on, for a few
optimizer steps; the sweep reads the child's ``/metrics`` and reports the peak, baseline, the
per-family split, the step time and whether it ran out of memory, then the largest configuration
that fits, measured and predicted. Modules, in data-flow order: ``grid`` (axes, placeholders, run
order), ``child`` (one process, watched over HTTP), ``reading`` (the exposition's figures),
``runner`` (the loop and the OOM verdict), ``fit`` (``max_fit``), ``report`` and ``plot``
(outputs). The command is ``memexporter.cli.sweep``.
"""
