"""Record what torch.cuda and NVML answer on this GPU, as fixtures for the CPU tests.

    python -m tests.cuda.record_fixtures [--out tests/fixtures/recorded] [--device 0] [--scenario NAME ...]

Each scenario runs in its own process, because the allocator backend and the memory fraction are
process-wide. The answers are recorded in the shape ``tests/support/cuda_standins.py`` replays
(the same as the SYNTHETIC fixtures), plus a ``recorded`` block naming the GPU, torch, CUDA and
the driver. Writes ``<gpu>_torch<version>_<scenario>.json`` into ``--out``, creating it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "recorded"
MiB = 1 << 20
_KEEP: list[Any] = []  # the scenario's live tensors, alive while the answers are read


def _capture(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"raises": f"{type(exc).__name__}: {exc}"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_answers(index: int) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(index)
    fields = {k: getattr(props, k) for k in ("name", "major", "minor", "total_memory", "multi_processor_count")}
    if hasattr(props, "uuid"):
        fields["uuid"] = str(props.uuid)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return {
        "properties": fields,
        "memory_stats": _capture(lambda: {k: int(v) for k, v in torch.cuda.memory_stats(index).items()}),
        "memory_fraction": _capture(lambda: float(fraction(index))) if fraction is not None else None,
        "mem_get_info": _capture(lambda: [int(x) for x in torch.cuda.mem_get_info(index)]),
        "has_primary_context": bool(torch._C._cuda_hasPrimaryContext(index)),
    }


def host_answers() -> dict[str, float] | None:
    """``torch.cuda.host_memory_stats()`` (the pinned host caching allocator); ``None`` before torch 2.6."""
    import torch

    getter = getattr(torch.cuda, "host_memory_stats", None)
    return dict(getter()) if getter is not None else None


def nvml_answers() -> dict[str, Any] | None:
    """Every GPU NVML sees, with its MIG slices; ``None`` without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None

    def memory(handle: Any) -> dict[str, Any]:
        """``{"memory": v1, "memory_v2": v2}``: ``nvmlDeviceGetMemoryInfo`` (used counts the driver's
        reservation) and, where the driver has it, ``nvmlDeviceGetMemoryInfo_v2`` (the reservation
        apart, used as nvidia-smi shows it) or what else it raised. No ``memory_v2``: the driver has
        no such call (FUNCTION_NOT_FOUND), or nvidia-ml-py has none (``memory_v2_binding``)."""
        m = pynvml.nvmlDeviceGetMemoryInfo(handle)
        out: dict[str, Any] = {"memory": {"total": int(m.total), "used": int(m.used), "free": int(m.free)}}
        if hasattr(pynvml, "nvmlMemory_v2"):
            v2 = _capture(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2))
            if not isinstance(v2, dict):
                out["memory_v2"] = {k: int(getattr(v2, k)) for k in ("total", "reserved", "free", "used")}
            elif not v2["raises"].startswith("NVMLError_FunctionNotFound"):
                out["memory_v2"] = v2
        return out

    def processes(handle: Any) -> dict[str, Any]:
        """``{"processes": [...]}`` from nvmlDeviceGetComputeRunningProcesses (this process as "self",
        an unavailable figure as None), or ``{}`` when the driver does not answer it."""
        listed = _capture(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if isinstance(listed, dict):
            return {}
        return {
            "processes": [
                {
                    "pid": "self" if int(p.pid) == os.getpid() else int(p.pid),
                    "used": p.usedGpuMemory,
                    "gpu_instance_id": int(p.gpuInstanceId),
                    "compute_instance_id": int(p.computeInstanceId),
                }
                for p in listed
            ]
        }

    gpus, strings, by_mig_uuid = [], "str", True
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        strings = "bytes" if isinstance(pynvml.nvmlDeviceGetName(h), bytes) else "str"
        mode = _capture(lambda h=h: list(pynvml.nvmlDeviceGetMigMode(h)))
        slices = []
        if isinstance(mode, list) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                m = _capture(lambda h=h, j=j: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j))
                if isinstance(m, dict):
                    continue
                uuid = _text(pynvml.nvmlDeviceGetUUID(m))
                by_mig_uuid = by_mig_uuid and not isinstance(
                    _capture(lambda u=uuid: pynvml.nvmlDeviceGetHandleByUUID(u)), dict
                )
                slices.append(
                    {
                        "uuid": uuid,
                        "name": _text(pynvml.nvmlDeviceGetName(m)),
                        "gpu_instance_id": int(pynvml.nvmlDeviceGetGpuInstanceId(m)),
                        **memory(m),
                        **processes(m),
                    }
                )
        gpus.append(
            {
                "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                "name": _text(pynvml.nvmlDeviceGetName(h)),
                "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                **memory(h),
                "mig_mode": mode if isinstance(mode, list) else None,
                "mig": slices,
                **processes(h),
            }
        )
    return {
        "strings": strings,
        "handle_by_mig_uuid": by_mig_uuid,
        **({} if hasattr(pynvml, "nvmlMemory_v2") else {"memory_v2_binding": False}),  # an nvidia-ml-py without v2
        "gpus": gpus,
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
    }


def _native(dev: str) -> str:
    """Small and large allocations, every other one freed: split blocks, both pools."""
    import torch

    blocks = [torch.empty(n, dtype=torch.uint8, device=dev) for n in [300 * MiB, 4096, 77 * MiB, 100_000, 25 * MiB] * 4]
    del blocks[::2]
    _KEEP.extend(blocks)
    return "native allocator: small and large blocks, every other one freed (inactive split blocks)"


def _fraction_after_oom(dev: str) -> str:
    """A 0.5 memory fraction, then allocations until the allocator refuses one (caught)."""
    import torch

    torch.cuda.set_per_process_memory_fraction(0.5, torch.device(dev))
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(1024 * MiB, dtype=torch.uint8, device=dev))
    except torch.cuda.OutOfMemoryError:
        pass
    del blocks[::2]
    _KEEP.extend(blocks)
    return "native allocator, set_per_process_memory_fraction(0.5), 1 GiB blocks until a caught OOM, half freed"


def _cuda_malloc_async(dev: str) -> str:
    _native(dev)
    return "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, the native scenario's allocations"


SCENARIOS: dict[str, tuple[Callable[[str], str], dict[str, str]]] = {
    "native": (_native, {}),
    "fraction_after_oom": (_fraction_after_oom, {}),
    "cudamallocasync": (
        _cuda_malloc_async,
        {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"},
    ),
}


def record_one(scenario: str, index: int) -> dict[str, Any]:
    """Run ``scenario`` in this process and return its fixture."""
    import torch

    description = SCENARIOS[scenario][0](f"cuda:{index}")
    torch.cuda.synchronize(index)
    backend = getattr(torch.cuda, "get_allocator_backend", None)
    answers = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "allocator_backend": backend() if backend is not None else None,
        "device_count": torch.cuda.device_count(),
        "devices": {str(index): torch_answers(index)},
        "nvml": nvml_answers(),
    }
    host = host_answers()
    if host is not None:
        answers["host_memory_stats"] = host
    return {
        "synthetic": False,
        "recorded": {
            "device_name": torch.cuda.get_device_name(index),
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "driver_version": (answers["nvml"] or {}).get("driver_version"),
            "recorded_by": f"tests/cuda/record_fixtures.py, scenario {scenario}",
            "scenario": description,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "answers": answers,
    }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the fixtures (created if missing)")
    ap.add_argument("--device", type=int, default=0, help="CUDA ordinal to record (default 0)")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default: all")
    ap.add_argument("--one", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    if args.one:
        json.dump(record_one(args.one, args.device), sys.stdout)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in args.scenario or list(SCENARIOS):
        env = {**os.environ, **SCENARIOS[scenario][1]}
        cmd = [sys.executable, "-m", "tests.cuda.record_fixtures", "--one", scenario, "--device", str(args.device)]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            print(f"[record] {scenario}: failed ({done.returncode})\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        record = json.loads(done.stdout)
        rec = record["recorded"]
        path = args.out / f"{_slug(rec['device_name'])}_torch{rec['torch_version'].split('+')[0]}_{scenario}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(
            f"[record] {scenario}: {path} ({len(record['answers']['devices'][str(args.device)]['memory_stats'])} "
            f"memory_stats keys, backend {record['answers']['allocator_backend']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
