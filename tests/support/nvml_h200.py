"""The NVML answers of an H200 for the stand-in (``nvml_standin.NvmlStandIn``): v1 and v2 memory info.

``h200_answers()``: the first GPU run's recording (v1) with a SYNTHETIC v2 answer derived from it.
``h200_recorded_v2()``: v1 and v2 as NVML answered them together on an H200, recorded
(``tests/fixtures/nvml/``), with what torch saw at the same moment.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support import REPO_ROOT

NVML_DIR = REPO_ROOT / "tests" / "fixtures" / "nvml"
H200_V2 = NVML_DIR / "nvidia-h200_driver580.159.04_memory_v2.json"


def h200_answers() -> dict[str, Any]:
    """The NVML answers of the H200 run (driver 580.159.04, torch 2.11.0+cu130; in
    shared/gpu/h200-2026-11-27, ``recorded/nvidia-h200_torch2.11.0_native.json``), with a v2
    answer beside the recorded v1 one.

    ``memory`` (v1) and the process line are the recording's, as NVML answered them on the GPU.
    ``memory_v2`` is SYNTHETIC: the recorder did not ask for v2 then. Its figures are derived from
    what that recording holds: ``free`` is NVML's free (and ``cudaMemGetInfo``'s, equal to the
    byte); ``reserved`` is NVML's total less ``cudaMemGetInfo``'s total (150,109,880,320, also
    ``total_memory``): 644,939,776 bytes, 615.06 MiB; ``used = total - reserved - free``, which is
    ``cudaMemGetInfo``'s total - free; ``total`` is v1's, as nvidia-smi showed it on that machine
    (143,771 MiB, ``logs/env.txt``). ``h200_recorded_v2()``, recorded later on an H200 with the same
    driver, holds those relations to the byte.
    """
    total, free, cuda_total = 150_754_820_096, 147_860_815_872, 150_109_880_320
    reserved = total - cuda_total
    gpu = {
        "uuid": "GPU-1420dfe2-68c0-6889-4308-4efc45aaef99",
        "name": "NVIDIA H200",
        "pci_bus_id": "00000000:00:06.0",
        "memory": {"total": total, "used": 2_894_004_224, "free": free},
        "memory_v2": {"total": total, "reserved": reserved, "free": free, "used": cuda_total - free},  # SYNTHETIC
        "mig_mode": [0, 0],
        "mig": [],
        "processes": [
            {"pid": "self", "used": 2_239_758_336, "gpu_instance_id": 4294967295, "compute_instance_id": 4294967295}
        ],
    }
    return {"strings": "str", "handle_by_mig_uuid": True, "gpus": [gpu], "driver_version": "580.159.04"}


def h200_recorded_v2() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(NVML answers, the record)`` of ``H200_V2``: the ``busy`` reading (1 GiB allocated through
    torch; v1, v2, identity and process list read together) as the stand-in's answers, and the
    whole record (``busy.mem_get_info``, ``busy.total_memory``, ``idle``, ``recorded``)."""
    record: dict[str, Any] = json.loads(H200_V2.read_text())
    answers = {"strings": "str", "handle_by_mig_uuid": True, "gpus": [record["busy"]["gpu"]]}
    return {**answers, "driver_version": record["recorded"]["driver_version"]}, record
