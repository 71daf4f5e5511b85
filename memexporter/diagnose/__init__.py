"""After the page: what grew, and who holds it.

A tensor census taken on the training thread every ``census_every`` steps (``census.py``), the
groups that grow (``growth.py``) and the Python paths that hold them (``holders.py``), autograd
graphs kept alive across steps (``autograd.py``), all driven by ``engine.py`` and published as
immutable ``findings.py``; served as ``/debug/memory`` and ``/debug/snapshot`` (``http.py``,
``debug=True``), written to ``oom_dump_dir`` before and at an OOM (``dumps.py``), said in one log
line (``words.py``) and read in a terminal by ``memexporter inspect`` (``inspect.py``: from a URL
through ``fetch.py``, with a whole-request deadline and a size cap, or from a dump file, both in
``reading.py``). ``/debug/*`` asks for the job's secret (``token.py``: a file only its user can
read); holder paths redact dict keys that are data (``names.py``); ``writer.py`` writes the dumps
off the training thread. ``wiring.attach()`` plugs it into an exporter. Importing this package imports nothing else
(``inspect.py`` and ``words.py`` need no torch).
"""
