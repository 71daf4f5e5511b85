"""SYNTHETIC fixtures of the other device families (issue 26): what ROCm's torch with amdsmi, torch.xpu
and MPS's torch.accelerator would answer in one situation each, never measured, each citing where its
shape comes from. ``synthetic_fixtures.py`` names them (``FAMILY_FIXTURES``) and writes them into
``families/``; the CUDA fixtures are in ``synthetic_cuda.py``.
"""

from __future__ import annotations

from typing import Any

from tests.support.memory_stats import (
    accelerator_nested,
    aggregate_only,
    array,
    flatten,
    host_memory_stats,
    nested,
    xpu_nested,
)
from tests.support.synthetic_cuda import GiB, MiB, cuda_device, reserved_bytes


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
    device = cuda_device(props, flatten(stats), 1.0, [total - 186 * GiB, total])
    mine = reserved_bytes(device) + 1630 * MiB  # the allocator's reserve, the HIP context, rocBLAS/MIOpen, RCCL
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
