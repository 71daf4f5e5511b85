"""SYNTHETIC fixtures: what torch.cuda and NVML would answer in five situations, and what ROCm's torch
with amdsmi, torch.xpu and MPS's torch.accelerator would answer in one each, never measured.

    python -m tests.support.synthetic_fixtures     # rewrites tests/fixtures/synthetic/*.json

Each file holds the answers of ``torch.cuda`` (``memory_stats``, ``get_device_properties``,
``mem_get_info``, ``get_per_process_memory_fraction``, ``get_allocator_backend``) and of NVML,
in the shape ``tests/support/cuda_standins.py`` replays and ``tests/cuda/record_fixtures.py``
records on a real GPU. The ``memory_stats`` key sets come from torch's source (see
``memory_stats.py``); the numbers are made up to be consistent (``all`` = small + large pool,
``current = allocated - freed``, reserved >= active >= allocated, device totals as vendors print
them) and are labelled synthetic in every file. A test keeps the files equal to this script.

This script names the fixtures and writes them; the CUDA situations are built in ``synthetic_cuda.py``,
the other device families in ``synthetic_families.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import REPO_ROOT
from tests.support.synthetic_cuda import (
    a100_fraction,
    a100_mig_slice,
    h100_cuda_malloc_async,
    h100_pluggable,
    v100_after_ooms,
)
from tests.support.synthetic_families import arc_b60_xpu, m4_max_mps, mi325x_rocm

SYNTHETIC_DIR = REPO_ROOT / "tests" / "fixtures" / "synthetic"


FIXTURES = {
    "v100_torch1.13_after_ooms": v100_after_ooms,
    "a100_torch2.13_fraction": a100_fraction,
    "a100_mig_1g.10gb_torch2.13": a100_mig_slice,
    "h100_torch2.13_pluggable": h100_pluggable,
    "h100_torch2.13_cudamallocasync": h100_cuda_malloc_async,
}
# The other device families (issue 26), in families/: the CUDA set's checks and recorder do not apply.
FAMILY_FIXTURES = {
    "mi325x_rocm7.0_torch2.13": mi325x_rocm,
    "arc_b60_xpu_torch2.13": arc_b60_xpu,
    "m4_max_mps_torch2.13": m4_max_mps,
}
FAMILIES_DIR = SYNTHETIC_DIR / "families"


def render(name: str) -> str:
    make = FIXTURES.get(name) or FAMILY_FIXTURES[name]
    return json.dumps(make(), indent=1) + "\n"


def main() -> None:
    FAMILIES_DIR.mkdir(parents=True, exist_ok=True)
    for folder, names in ((SYNTHETIC_DIR, FIXTURES), (FAMILIES_DIR, FAMILY_FIXTURES)):
        for name in names:
            path: Path = folder / f"{name}.json"
            path.write_text(render(name))
            print(f"wrote {path.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
