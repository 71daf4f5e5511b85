"""HTTP, served by a helper process beside the training process (DESIGN.md §8: nothing competes with the
training thread for the GIL).

Two halves. ``serving/job/`` runs in the training process: it starts the helper and publishes snapshots.
Everything else here runs in the helper (``helper.py`` is its entry) and never imports torch, nor any
part of memexporter that does (``tests/unit/serving/test_helper_imports.py`` reads the imports):
``board`` (the shared memory the snapshots travel through) and ``channel`` (the socketpair the rest
travels through) are both sides' wire; ``listener`` (accept, read, bound, deadlines), ``conn`` (one
connection, the dropped-connection counts) and ``stream`` (its deadline-bound reads and writes),
``workers`` (the threads that answer), ``handler`` (the standard library's HTTP parsing and wsgiref,
made quiet), ``budget`` (the CPU budget and rate limits), ``router`` (the routes, HEAD, 429),
``exposition`` and ``textformat`` (``/metrics`` and ``/live.json`` from a snapshot), ``page`` (the
landing page), ``guard`` and ``forward`` (the debug routes' checks, and their requests to the job),
``parent`` and ``ending`` (the job's end, observed), ``handover`` (the port, given to a restarted job);
``server`` puts the HTTP side together."""
