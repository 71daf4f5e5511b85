"""The exporter's HTTP server: ``listener`` (accept, read, bound, deadlines), ``conn`` (one
connection and its deadline-bound I/O, the dropped-connection counts), ``handler`` (the standard
library's HTTP parsing and wsgiref, made quiet). ``memexporter.server`` puts the app on it."""
