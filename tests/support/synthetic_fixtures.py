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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import REPO_ROOT
from tests.support.memory_stats import (
    accelerator_nested,
    aggregate_only,
    array,
    flatten,
    host_memory_stats,
    nested,
    xpu_nested,
)

SYNTHETIC_DIR = REPO_ROOT / "tests" / "fixtures" / "synthetic"
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


def _reserved(device: dict[str, Any]) -> int:
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


def _device(props: dict[str, Any], stats: Any, fraction: Any, mem_get_info: Any) -> dict[str, Any]:
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
    device = _device(props, flatten(stats), None, [1400 * MiB, total])  # torch 1.13: no fraction getter, no uuid
    # The only process on the GPU: the allocator's reserve and a CUDA 11.7 context with cuBLAS' workspace.
    gpu = _nvml_gpu(
        "GPU-6f2e5c71-0a4b-9d3e-52c1-8e7f90ab34cd",
        "Tesla V100-SXM2-16GB",
        "00000000:1A:00.0",
        16384 * MiB,
        14760 * MiB,
        processes=[_process("self", _reserved(device) + 414 * MiB)],
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
    device = _device(props, flatten(stats), 0.5, [40246 * MiB, total])
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
            processes=[_process(51877, 268 * MiB), _process("self", _reserved(device) + 1210 * MiB)],
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
    device = _device(props, flatten(stats), 1.0, [1812 * MiB, total])
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
    device = _device(
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
    device = _device(props, stats, 1.0, [29207 * MiB, props["total_memory"]])
    return _record(
        "Shaped like an H100 on torch 2.13 under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.",
        "2.13.0+cu128",
        "12.8",
        "cudaMallocAsync",
        device,
        [gpu],
        host_memory_stats(2 * GiB, 2 * GiB, 8, 8),
    )


def _family_record(description: str, sources: str, answers: dict[str, Any]) -> dict[str, Any]:
    """A fixture of another device family; ``sources``: where its shape comes from (cited)."""
    return {
        "synthetic": True,
        "provenance": (
            "SYNTHETIC, not measured on the device: made by tests/support/synthetic_fixtures.py. "
            f"Shapes from {sources}; numbers invented to be consistent. {description}"
        ),
        "answers": answers,
    }


def _amdsmi_process(pid: int | str, vram: int | str) -> dict[str, Any]:
    """One entry of amdsmi_get_gpu_process_list() (amdsmi 7.0.2 amdsmi_interface.py): bytes, ns; "N/A"
    where the library cannot say. ``pid`` "self": the process that replays the fixture."""
    return {
        "name": "python3" if pid == "self" else "N/A",
        "pid": pid,
        "mem": vram,
        "engine_usage": {"gfx": 88120455210, "enc": 0},
        "memory_usage": {"gtt_mem": 6 * MiB, "cpu_mem": 0, "vram_mem": vram},
        "cu_occupancy": 0,
    }


def mi325x_rocm() -> dict[str, Any]:
    total = 256 * GiB
    stats = nested(
        "2.13",
        {
            "allocated_bytes": array(
                (90 * MiB, 130 * MiB, 2 << 40), (150 * GiB, 171 * GiB, 90 << 40), 171 * GiB + 110 * MiB
            ),
            "reserved_bytes": array(
                (120 * MiB, 160 * MiB, 300 * MiB), (178 * GiB, 180 * GiB, 260 * GiB), 180 * GiB + 160 * MiB
            ),
            "active_bytes": array(
                (90 * MiB, 130 * MiB, 2 << 40), (150 * GiB, 171 * GiB, 90 << 40), 171 * GiB + 110 * MiB
            ),
            "inactive_split_bytes": array(
                (20 * MiB, 30 * MiB, 200 * GiB), (3 * GiB, 5 * GiB, 8 << 40), 5 * GiB + 30 * MiB
            ),
            "requested_bytes": array(
                (89 * MiB, 129 * MiB, (2 << 40) - GiB),
                (150 * GiB - MiB, 171 * GiB - MiB, 90 << 40),
                171 * GiB + 108 * MiB,
            ),
            "allocation": array((3012, 4100, 610224117), (512, 770, 32140518), 4870),
            "segment": array((60, 80, 150), (170, 190, 260), 270),
            "active": array((3012, 4100, 610224117), (515, 773, 32140518), 4873),
            "inactive_split": array((30, 60, 50117552), (20, 40, 3004871), 100),
        },
        {"max_split_size": -1, "num_device_alloc": 150 + 260, "num_device_free": (150 - 60) + (260 - 170)},
    )
    # torch's HIP build: the UUID's 16 bytes are the ASCII of the KFD unique id "b39adaf836600b31"
    # (ROCm clr rocdevice.cpp strips "GPU-"); str() shows their hex. gcnArchName as on an MI3xx.
    props = {
        "name": "AMD Instinct MI325X",
        "gcnArchName": "gfx942:sramecc+:xnack-",
        "major": 9,
        "minor": 4,
        "total_memory": total,
        "multi_processor_count": 304,
        "uuid": "62333961-6461-6638-3336-363030623331",
        "pci_bus_id": 0xC1,
        "pci_device_id": 0,
        "pci_domain_id": 0,
    }
    device = _device(props, flatten(stats), 1.0, [total - 186 * GiB, total])
    mine = _reserved(device) + 1630 * MiB  # the allocator's reserve, the HIP context, rocBLAS/MIOpen, RCCL
    # HIP_VISIBLE_DEVICES=1: cuda:0 is amdsmi's second GPU. Before ROCm 7.12 amdsmi's UUID is built
    # from the ASIC serial and device id (amd_smi_uuid.cc), unlike torch's.
    gpus = [
        {
            "bdf": f"0000:{bus:02x}:00.0",
            "uuid": uuid,
            "asic_info": {
                "market_name": "AMD Instinct MI325X",
                "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "subvendor_id": "0x1002",
                "device_id": "0x74a5",
                "rev_id": "0x00",
                "asic_serial": serial,
                "oam_id": oam,
                "num_compute_units": 304,
                "target_graphics_version": "gfx942",
                "subsystem_id": "0x74a5",
            },
            "memory": {"vram_total": total, "vram_used": used},
            "processes": processes,
        }
        for bus, uuid, serial, oam, used, processes in [
            (
                0x11,
                "a1ff74a5-0000-1000-8044-21c0d7e6a902",
                "0xA14421C0D7E6A902",
                0,
                120 * GiB,
                [_amdsmi_process(40211, 120 * GiB - 300 * MiB)],
            ),
            (
                0xC1,
                "b3ff74a5-0000-1000-809a-daf836600b31",
                "0xB39ADAF836600B31",
                1,
                mine + 2 * GiB,
                [_amdsmi_process(51877, 2 * GiB), _amdsmi_process("self", mine)],
            ),
        ]
    ]
    return _family_record(
        "Shaped like an AMD Instinct MI325X on torch 2.13's ROCm build, seen as cuda:0 under HIP_VISIBLE_DEVICES=1, "
        "beside another job's process on the same card.",
        "torch's HIP build (the CUDA memory_stats keys: the same Module.cpp, hipified; torch.version.hip as "
        "'6.2.41133-dd7f95766' in torch 2.5.1+rocm6.2 READMEs), ROCm clr rocdevice.cpp (the UUID's ASCII bytes), "
        "amdsmi 7.0.2 amdsmi_interface.py (amdsmi_get_gpu_asic_info keys, memory in bytes, process-list dicts)",
        {
            "torch_version": "2.13.0+rocm7.0",
            "cuda_version": None,
            "hip_version": "7.0.51831-a3e329ad8",
            "allocator_backend": "native",
            "device_count": 1,
            "devices": {"0": device},
            "host_memory_stats": host_memory_stats(512 * MiB, 64 * MiB, 12, 3),
            "amdsmi": {"gpus": gpus},
        },
    )


def arc_b60_xpu() -> dict[str, Any]:
    total = 24480 * MiB  # _XpuDeviceProperties prints total_memory=24480MB for an Arc Pro B60
    stats = xpu_nested(
        "2.13",
        {
            "allocated_bytes": array(
                (40 * MiB, 60 * MiB, 300 * GiB), (9 * GiB, 11 * GiB, 4 << 40), 11 * GiB + 60 * MiB
            ),
            "reserved_bytes": array(
                (50 * MiB, 70 * MiB, 120 * MiB), (12 * GiB, 13 * GiB, 20 * GiB), 13 * GiB + 70 * MiB
            ),
            "active_bytes": array((40 * MiB, 60 * MiB, 300 * GiB), (9 * GiB, 11 * GiB, 4 << 40), 11 * GiB + 60 * MiB),
            "inactive_split_bytes": array((5 * MiB, 9 * MiB, 20 * GiB), (400 * MiB, 700 * MiB, 90 * GiB), 705 * MiB),
            "requested_bytes": array(
                (39 * MiB, 59 * MiB, 299 * GiB), (9 * GiB - MiB, 11 * GiB - MiB, 4 << 40), 11 * GiB + 58 * MiB
            ),
            "allocation": array((800, 1100, 9000000), (90, 140, 600000), 1200),
            "segment": array((25, 35, 60), (24, 26, 40), 60),
            "active": array((800, 1100, 9000000), (92, 142, 600000), 1202),
            "inactive_split": array((5, 9, 400000), (4, 8, 90000), 16),
        },
    )
    props = {
        "name": "Intel(R) Arc(TM) Pro B60 Graphics",
        "platform_name": "Intel(R) oneAPI Unified Runtime over Level-Zero V2",
        "vendor": "Intel(R) Corporation",
        "device_id": 0xE211,
        "driver_version": "1.15.38308+1",
        "type": "gpu",
        "total_memory": total,
        "uuid": "868011e2-0000-0000-1700-000000000000",
    }
    device = {
        "properties": props,
        "memory_stats": flatten(stats),
        "memory_fraction": 1.0,
        "mem_get_info": [total - 13 * GiB - 70 * MiB - 300 * MiB, total],
    }
    return _family_record(
        "Shaped like an Intel Arc Pro B60 on torch 2.13+xpu; the device's free memory is Level Zero's (this job and "
        "300 MiB of others).",
        "torch/csrc/xpu/Module.cpp THXPModule_memoryStats (nine arrays from torch 2.11, pytorch/pytorch#169812; no "
        "scalars), torch/xpu/memory.py and __init__.py of torch 2.13 (mem_get_info, the fraction getter, "
        "_XpuDeviceProperties), and the B60's printed properties in intel/torch-xpu-ops#5087",
        {
            "family": "xpu",
            "torch_version": "2.13.0+xpu",
            "device_count": 1,
            "initialized": True,
            "devices": {"0": device},
        },
    )


def m4_max_mps() -> dict[str, Any]:
    recommended = 36 * GiB  # Metal's recommendedMaxWorkingSetSize, about 75% of a 48 GB Mac
    stats = accelerator_nested(
        {
            "allocated_bytes": aggregate_only(1400 * MiB, 1500 * MiB, 900 * GiB),
            "reserved_bytes": aggregate_only(8 * GiB, 9 * GiB, 30 * GiB),
        },
        {},
    )
    driver = 11323 * MiB  # Metal's currentAllocatedSize for the process: the heaps and MPSGraph's own buffers
    return _family_record(
        "Shaped like a 48 GB M4 Max on torch 2.13 (MPS): 1.4 GiB in tensors, 8 GiB of allocator heaps, 11 GiB held by "
        "Metal for the process (karpathy/nanochat#838 printed 11322.84 MiB driver-allocated against a 1499.78 MiB peak).",
        "torch/csrc/DeviceAccelerator.cpp (torch.accelerator.memory_stats: 122 keys, unfilled ones zero), "
        "MPSAllocator.mm getDeviceStats (only the aggregate allocated and reserved bytes), torch 2.13's "
        "MPSAllocatorInterface.h (IMPSAllocator is a c10::DeviceAllocator, pytorch/pytorch#186748) and "
        "getMemoryInfo (free = recommendedMaxWorkingSetSize - currentAllocatedSize)",
        {
            "family": "mps",
            "torch_version": "2.13.0",
            "allocator_initialized": True,
            "memory_stats": flatten(stats),
            "memory_info": [recommended - driver, recommended],
        },
    )


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
