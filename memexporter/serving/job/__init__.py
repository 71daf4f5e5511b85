"""The training process's side of serving: what runs in the job (the helper's side is ``serving/`` itself).

``link.py`` starts the helper (``spawn.py``), publishes a snapshot a second onto the board (``render.py``:
the text exposition and ``live.py``'s JSON, from one collection of the registry), answers the debug
requests the helper admitted (``debug.py``) and stops it; ``binding.py`` checks the address and TLS files
in ``start()`` and words a bind failure the helper reports."""
