"""The exporter's HTTP server: ``listener`` (accept, read, bound, deadlines), ``conn`` (one
connection, the dropped-connection counts) and ``stream`` (its deadline-bound reads and writes),
``workers`` (the threads that answer), ``handler`` (the standard library's HTTP parsing and
wsgiref, made quiet), ``budget`` (the CPU budget and rate limits), ``router`` (the routes, HEAD,
429) and ``exposition`` (``/metrics``, cached while the server is busy). ``memexporter.serving.server``
puts them together."""
