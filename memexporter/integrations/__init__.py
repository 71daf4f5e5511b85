"""Framework callbacks: ``memexporter.integrations.lightning`` and ``.transformers``.

Each module holds one ``MemexporterCallback`` for its framework; importing it imports the
framework (``pip install 'memexporter[frameworks]'``). This package itself imports neither, so
``import memexporter`` never does (DESIGN.md §7). The framework-neutral half both callbacks share
is ``session.py``.
"""
