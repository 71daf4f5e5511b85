"""SYNTHETIC fixtures of CUDA GPUs: what torch.cuda and NVML would answer in five situations, never
measured (a V100 after OOMs on torch 1.13, an A100 under a memory fraction, a MIG slice, an H100
behind a pluggable allocator and under cudaMallocAsync). ``synthetic_fixtures.py`` names them
(``FIXTURES``) and writes them; the other device families are in ``synthetic_families.py``, which
builds its ROCm device with ``cuda_device`` and ``reserved_bytes`` from here.

Each answers ``torch.cuda`` (``memory_stats``, ``get_device_properties``, ``mem_get_info``,
``get_per_process_memory_fraction``, ``get_allocator_backend``) and NVML, in the shape
``tests/support/cuda_standins.py`` replays and ``tests/cuda/record_fixtures.py`` records on a real GPU.
"""

from __future__ import annotations

from typing import Any

from tests.support.memory_stats import array, flatten, host_memory_stats, nested

MiB, GiB = 1 << 20, 1 << 30
PLUGGABLE_STATS = (
    "RuntimeError: CUDAPluggableAllocator does not yet support getDeviceStats. "
    "If you need it, please file an issue describing your use case."
)
PLUGGABLE_FRACTION = (
    "RuntimeError: CUDAPluggableAllocator does not yet support getMemoryFraction. "
    "If you need it, please file an issue describing your use case."
)


def _nvml_gpu(
    uuid: str,
    name: str,
    bus: str,
    total: int,
    used: int,
    mig: list[dict[str, Any]] | None = None,
    mig_capable: bool = False,
    processes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An NVML device: nvmlDeviceGetMemoryInfo (v1: free = total - used), PCI busId, MIG slices, and
    nvmlDeviceGetComputeRunningProcesses (``_process``)."""
    return {
        "uuid": uuid,
        "name": name,
        "pci_bus_id": bus,
        "memory": {"total": total, "used": used, "free": total - used},
        "mig_mode": None if not mig_capable else [int(mig is not None)] * 2,
        "mig": mig or [],
        "processes": processes or [],
    }


def _mig(
    uuid: str, name: str, gpu_instance_id: int, total: int, used: int, processes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "name": name,
        "gpu_instance_id": gpu_instance_id,
        "memory": {"total": total, "used": used, "free": total - used},
        "processes": processes or [],
    }


def _process(pid: int | str, used: int | None, gpu_instance_id: int = 0xFFFFFFFF) -> dict[str, Any]:
    """One entry of nvmlDeviceGetComputeRunningProcesses (c_nvmlProcessInfo_v3_t): ``pid`` "self" is
    the process that replays the fixture; ``used`` None is NVML_VALUE_NOT_AVAILABLE; instance ids
    0xFFFFFFFF (invalid) outside MIG."""
    return {
        "pid": pid,
        "used": used,
        "gpu_instance_id": gpu_instance_id,
        "compute_instance_id": 0 if gpu_instance_id != 0xFFFFFFFF else 0xFFFFFFFF,
    }


def reserved_bytes(device: dict[str, Any]) -> int:
    return int(device["memory_stats"]["reserved_bytes.all.current"])


def _record(
    description: str,
    torch_version: str,
    cuda_version: str,
    backend: str | None,
    device: dict[str, Any],
    nvml_gpus: list[dict[str, Any]],
    host: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``host``: what torch.cuda.host_memory_stats() answers (torch 2.6 and later); None: no such call."""
    return {
        "synthetic": True,
        "provenance": (
            "SYNTHETIC, not measured on a GPU: made by tests/support/synthetic_fixtures.py. Key sets from "
            f"torch {torch_version.split('+', maxsplit=1)[0]}'s source (Module.cpp THCPModule_memoryStats, DeviceStats); "
            "numbers invented to be consistent. " + description
        ),
        "answers": {
            "torch_version": torch_version,
            "cuda_version": cuda_version,
            "allocator_backend": backend,
            "device_count": 1,
            "devices": {"0": device},
            **({"host_memory_stats": host} if host is not None else {}),
            "nvml": {"strings": "str", "handle_by_mig_uuid": True, "gpus": nvml_gpus},
        },
    }


def cuda_device(props: dict[str, Any], stats: Any, fraction: Any, mem_get_info: Any) -> dict[str, Any]:
    return {
        "properties": props,
        "memory_stats": stats,
        "memory_fraction": fraction,
        "mem_get_info": mem_get_info,
        "has_primary_context": True,
    }


def v100_after_ooms() -> dict[str, Any]:
    total = 16160 * MiB  # torch prints total_memory=16160MB for a V100-SXM2-16GB; NVML says 16384 MiB
    stats = nested(
        "1.13",
        {
            "allocated_bytes": array(
                (38 * MiB, 64 * MiB, 187 * GiB), (9943 * MiB, 31898432 * 512, 9019430400 * 512), 31981568 * 512
            ),
            "reserved_bytes": array(
                (44 * MiB, 70 * MiB, 142 * MiB), (14296 * MiB, 15870 * MiB, 27956 * MiB), 15926 * MiB
            ),
            "active_bytes": array(
                (38 * MiB, 64 * MiB, 187 * GiB), (9963 * MiB, 31939392 * 512, 9019430400 * 512), 32022528 * 512
            ),
            "inactive_split_bytes": array(
                (11 * 512 * 1024, 14 * MiB, 56 * GiB), (1280 * MiB, 2048 * MiB, 1600 * GiB), 2056 * MiB
            ),
            "allocation": array((1843, 2950, 61204338), (212, 388, 3410220), 3301),
            "segment": array((22, 35, 71), (61, 74, 143), 105),
            "active": array((1843, 2950, 61204338), (214, 390, 3410220), 3303),
            "inactive_split": array((14, 31, 9811442), (9, 23, 1002117), 50),
        },
        {"num_alloc_retries": 5, "num_ooms": 3, "max_split_size": -1},
    )
    props = {"name": "Tesla V100-SXM2-16GB", "major": 7, "minor": 0, "total_memory": total, "multi_processor_count": 80}
    device = cuda_device(props, flatten(stats), None, [1400 * MiB, total])  # torch 1.13: no fraction getter, no uuid
    # The only process on the GPU: the allocator's reserve and a CUDA 11.7 context with cuBLAS' workspace.
    gpu = _nvml_gpu(
        "GPU-6f2e5c71-0a4b-9d3e-52c1-8e7f90ab34cd",
        "Tesla V100-SXM2-16GB",
        "00000000:1A:00.0",
        16384 * MiB,
        14760 * MiB,
        processes=[_process("self", reserved_bytes(device) + 414 * MiB)],
    )
    return _record(
        "Shaped like a Tesla V100-SXM2-16GB on torch 1.13.1 after three OOMs the job caught "
        "(num_ooms 3, num_alloc_retries 5); that torch has no device UUID, fraction or backend getters.",
        "1.13.1+cu117",
        "11.7",
        None,
        device,
        [gpu],
    )


def a100_fraction() -> dict[str, Any]:
    total = 84987740160  # ~81050 MiB as torch prints it for an A100-SXM4-80GB; NVML: 81920 MiB
    stats = nested(
        "2.13",
        {
            "allocated_bytes": array(
                (60 * MiB, 84 * MiB, 896 * GiB), (31888 * MiB, 38000 * MiB, 20 << 40), 38060 * MiB
            ),
            "reserved_bytes": array(
                (78 * MiB, 100 * MiB, 184 * MiB), (39602 * MiB, 40220 * MiB, 56000 * MiB), 40320 * MiB
            ),
            "active_bytes": array((60 * MiB, 84 * MiB, 896 * GiB), (31908 * MiB, 38020 * MiB, 20 << 40), 38080 * MiB),
            "inactive_split_bytes": array(
                (12 * MiB, 20 * MiB, 128 * GiB), (2100 * MiB, 3000 * MiB, 5 << 40), 3010 * MiB
            ),
            "requested_bytes": array(
                (59 * MiB, 83 * MiB, 886 * GiB), (31878 * MiB, 37990 * MiB, (20 << 40) - 20 * GiB), 38049 * MiB
            ),
            "allocation": array((2210, 3105, 410224117), (388, 602, 22140518), 3690),
            "segment": array((39, 50, 92), (118, 131, 187), 178),
            "active": array((2210, 3105, 410224117), (391, 605, 22140518), 3693),
            "inactive_split": array((21, 44, 40117552), (17, 29, 2004871), 70),
        },
        {"max_split_size": -1, "num_device_alloc": 92 + 187, "num_device_free": (92 - 39) + (187 - 118)},
        private_pools={(0, 1): array(large=(512 * MiB, 512 * MiB, 512 * MiB), peak=512 * MiB)},
    )  # a torch.cuda.MemPool
    props = {
        "name": "NVIDIA A100-SXM4-80GB",
        "major": 8,
        "minor": 0,
        "total_memory": total,
        "multi_processor_count": 108,
        "uuid": "3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63",
    }
    device = cuda_device(props, flatten(stats), 0.5, [40246 * MiB, total])
    # CUDA_VISIBLE_DEVICES=3: cuda:0 is NVML's fourth GPU.
    gpus = [
        _nvml_gpu(
            f"GPU-0{i}a1b2c3-d4e5-f607-1829-3a4b5c6d7e8f",
            "NVIDIA A100-SXM4-80GB",
            f"00000000:{0x07 + i * 0x40:02X}:00.0",
            81920 * MiB,
            61440 * MiB,
            mig_capable=True,
        )
        for i in range(3)
    ]
    # This process (the allocator's reserve, a context, cuBLAS/cuDNN workspaces and NCCL's buffers)
    # and a profiler's small process beside it.
    gpus.append(
        _nvml_gpu(
            "GPU-3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63",
            "NVIDIA A100-SXM4-80GB",
            "00000000:C7:00.0",
            81920 * MiB,
            40806 * MiB,
            mig_capable=True,
            processes=[_process(51877, 268 * MiB), _process("self", reserved_bytes(device) + 1210 * MiB)],
        )
    )
    return _record(
        "Shaped like an A100-SXM4-80GB on torch 2.13 with set_per_process_memory_fraction(0.5), seen as "
        "cuda:0 under CUDA_VISIBLE_DEVICES=3, with a MemPool (0, 1) holding 512 MiB, and 1 GiB of "
        "pinned host memory (a DataLoader with pin_memory=True).",
        "2.13.0+cu128",
        "12.8",
        "native",
        device,
        gpus,
        host_memory_stats(GiB, 256 * MiB, 24, 6),
    )


def a100_mig_slice() -> dict[str, Any]:
    total = 9632 * MiB  # a 1g.10gb slice: NVML reports 9728 MiB
    stats = nested(
        "2.13",
        {
            "allocated_bytes": array((16 * MiB, 24 * MiB, 100 * GiB), (6100 * MiB, 7620 * MiB, 2 << 40), 7637 * MiB),
            "reserved_bytes": array((22 * MiB, 30 * MiB, 46 * MiB), (7608 * MiB, 8020 * MiB, 11000 * MiB), 8040 * MiB),
            "active_bytes": array((16 * MiB, 24 * MiB, 100 * GiB), (6110 * MiB, 7630 * MiB, 2 << 40), 7647 * MiB),
            "inactive_split_bytes": array((4 * MiB, 6 * MiB, 10 * GiB), (600 * MiB, 900 * MiB, 300 * GiB), 904 * MiB),
            "requested_bytes": array(
                (31 * 512 * 1024, 47 * 512 * 1024, 100000 * MiB),
                (6094 * MiB, 7614 * MiB, (2 << 40) - 2 * GiB),
                7631 * MiB,
            ),
            "allocation": array((980, 1402, 88112004), (141, 233, 5220118), 1600),
            "segment": array((11, 15, 23), (52, 60, 97), 74),
            "active": array((980, 1402, 88112004), (143, 235, 5220118), 1602),
            "inactive_split": array((8, 19, 3001220), (6, 14, 702113), 31),
        },
        {"num_alloc_retries": 2, "max_split_size": -1, "num_device_alloc": 23 + 97, "num_device_free": 12 + 45},
    )
    mig_hex = "9b1c5e7a-2d4f-5a60-8c3b-1e9f0d2a7c45"
    props = {
        "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        "major": 8,
        "minor": 0,
        "total_memory": total,
        "multi_processor_count": 14,
        "uuid": mig_hex,
    }
    device = cuda_device(props, flatten(stats), 1.0, [1812 * MiB, total])
    slices = [
        _mig(
            f"MIG-{i}c0d1e2f-3a4b-5c6d-7e8f-90a1b2c3d4e5",
            "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            11 + i,
            9728 * MiB,
            3000 * MiB,
        )
        for i in range(2)
    ]
    # In a container with its own PID namespace: the driver lists the job under its host PID.
    slices.append(
        _mig(
            f"MIG-{mig_hex}",
            "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            13,
            9728 * MiB,
            7820 * MiB,
            processes=[_process(2716403, 8040 * MiB + 310 * MiB, gpu_instance_id=13)],
        )
    )
    gpu = _nvml_gpu(
        "GPU-e1c4a8f2-6b3d-4f90-8a7e-2c5d1b0f9e36",
        "NVIDIA A100-SXM4-80GB",
        "00000000:4E:00.0",
        81920 * MiB,
        23000 * MiB,
        mig=slices,
        mig_capable=True,
    )
    return _record(
        "Shaped like a MIG 1g.10gb slice (GPU instance 13) of an A100-SXM4-80GB on torch 2.13: torch gives "
        "the slice's bare UUID, NVML spells it MIG-...; it runs in a container whose PID namespace hides it "
        "from the driver's process list; nothing pinned.",
        "2.13.0+cu128",
        "12.8",
        "native",
        device,
        [gpu],
        host_memory_stats(0, 0, 0, 0),
    )


def _h100(uuid_hex: str, used: int, mine: int) -> tuple[dict[str, Any], dict[str, Any]]:
    props = {
        "name": "NVIDIA H100 80GB HBM3",
        "major": 9,
        "minor": 0,
        "total_memory": 84942979072,
        "multi_processor_count": 132,
        "uuid": uuid_hex,
    }  # NVML: 81559 MiB
    return props, _nvml_gpu(
        f"GPU-{uuid_hex}",
        "NVIDIA H100 80GB HBM3",
        "00000000:18:00.0",
        81559 * MiB,
        used,
        processes=[_process("self", mine)],
    )


def h100_pluggable() -> dict[str, Any]:
    props, gpu = _h100("5d0e7b3a-9c1f-4a28-b6e4-0f3a8c2d1e97", 63488 * MiB, 63488 * MiB)  # the RMM pool and the context
    device = cuda_device(
        props, {"raises": PLUGGABLE_STATS}, {"raises": PLUGGABLE_FRACTION}, [17188 * MiB, props["total_memory"]]
    )
    return _record(
        "Shaped like an H100 on torch 2.13 with an RMM pool behind torch.cuda.memory.CUDAPluggableAllocator, "
        "which raises on memory_stats() and get_per_process_memory_fraction().",
        "2.13.0+cu128",
        "12.8",
        "pluggable",
        device,
        [gpu],
        host_memory_stats(0, 0, 0, 0),
    )


def h100_cuda_malloc_async() -> dict[str, Any]:
    props, gpu = _h100("a7e3c1d9-4b2f-4e86-9d05-3c8b7f1e2a64", 51800 * MiB, 50 * GiB + 596 * MiB)  # reserve + context
    # CUDAMallocAsyncAllocator::getDeviceStats fills only the aggregate current/peak of allocated and
    # active bytes (the pool's used memory) and reserved bytes; every other Stat stays zero.
    used, used_peak, reserved, reserved_peak = 45 * GiB, 52 * GiB, 50 * GiB, 58 * GiB
    stats = flatten(nested("2.13", {}, {}))
    stats["max_split_size"] = 0
    for key, value in {
        "allocated_bytes": (used, used_peak),
        "active_bytes": (used, used_peak),
        "reserved_bytes": (reserved, reserved_peak),
    }.items():
        stats[f"{key}.all.current"], stats[f"{key}.all.peak"] = value
    device = cuda_device(props, stats, 1.0, [29207 * MiB, props["total_memory"]])
    return _record(
        "Shaped like an H100 on torch 2.13 under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.",
        "2.13.0+cu128",
        "12.8",
        "cudaMallocAsync",
        device,
        [gpu],
        host_memory_stats(2 * GiB, 2 * GiB, 8, 8),
    )
