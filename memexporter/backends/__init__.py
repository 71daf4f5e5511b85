"""Backends: the only modules that touch torch.cuda (torch.py), pynvml (nvml.py) and psutil or
cgroup files (host.py). Everything above them takes a backend as a constructor argument, so tests
substitute fakes that answer the same methods."""
