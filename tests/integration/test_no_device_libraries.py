"""A machine without any device library (issue 26): no NVML (``nvidia-ml-py``), no ``amdsmi``, a
CPU torch. Importing memexporter loads none of them, and a started exporter that trains a step
and serves a scrape writes nothing to the job's stderr and serves no device series: an absent
library is a quiet fact, not a warning on every start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT
from tests.support.demo import module_env
from tests.support.stderr import besides_serving

pytestmark = [pytest.mark.integration]

# ``sys.modules[name] = None`` makes ``import name`` raise ImportError, as on a machine without it.
SCRIPT = """
import json, sys, urllib.request
for name in ("pynvml", "amdsmi"):
    sys.modules[name] = None
import memexporter
loaded = [m for m in ("pynvml", "amdsmi", "torch") if sys.modules.get(m) is not None]
import torch
e = memexporter.start(port=0, addr="127.0.0.1")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4)).sum().backward()
opt.step()
body = urllib.request.urlopen(e.url, timeout=10).read().decode()
e.stop()
device = sorted({l.split("{")[0] for l in body.splitlines()
                 if l.startswith(("memexporter_device_", "memexporter_host_pinned", "memexporter_allocator_"))})
print(json.dumps({"loaded_by_import": loaded, "device_series": device}))
"""


def test_no_device_library_no_import_no_output_no_device_series() -> None:
    env = {k: v for k, v in module_env().items() if k != "MEMEXPORTER_STRICT"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True, env=env, cwd=REPO_ROOT
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"loaded_by_import": [], "device_series": []}, got
    assert besides_serving(out.stderr) == "", f"the job's stderr got: {out.stderr!r}"
