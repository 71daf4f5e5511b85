"""The rows of what the driver libraries and the host report: the device's memory and identity (NVML,
amdsmi, Level Zero; collectors/device.py) and the process's host memory (psutil and cgroup files;
collectors/host.py).
"""

from __future__ import annotations

from memexporter.metrics.spec import _MS, DEVICE, RANK, MetricSpec, SemConv, _g

DEVICE_SPECS: tuple[MetricSpec, ...] = (
    # --- Device, from NVML (collectors/device.py).
    _g(
        "device_total_bytes",
        unit="bytes",
        help="Total device memory, as nvidia-smi shows it: NVML nvmlDeviceGetMemoryInfo_v2().total (v1's is the same), used + reserved + free; amdsmi_get_gpu_memory_total(VRAM) on AMD; torch.xpu.mem_get_info() total on Intel.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.total",
        cuda=True,
        semconv=SemConv("hw.gpu.memory.limit", "hw.gpu"),
    ),
    _g(
        "device_used_bytes",
        unit="bytes",
        help="Device memory used by all processes, as nvidia-smi shows it: NVML nvmlDeviceGetMemoryInfo_v2().used, without the driver's reservation (device_reserved_bytes); where the driver or nvidia-ml-py has no v2, nvmlDeviceGetMemoryInfo().used, which includes it; amdsmi_get_gpu_memory_usage(VRAM) on AMD; total - free on Intel.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.used",
        cuda=True,
        semconv=SemConv("hw.gpu.memory.usage", "hw.gpu"),
    ),
    _g(
        "device_free_bytes",
        unit="bytes",
        help="Free device memory: NVML nvmlDeviceGetMemoryInfo_v2().free (v1's is the same); total - used on AMD; torch.xpu.mem_get_info() free (Level Zero) on Intel.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.free",
        cuda=True,
        detail=True,
    ),
    _g(
        "device_reserved_bytes",
        unit="bytes",
        help="Device memory the driver and firmware set aside for themselves, which no process can allocate: NVML nvmlDeviceGetMemoryInfo_v2().reserved. Absent where the driver or nvidia-ml-py has no v2 (device_used_bytes then includes it), and on AMD, Intel and Apple devices.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.reserved",
        cuda=True,
        detail=True,
    ),
    _g(
        "device_process_used_bytes",
        unit="bytes",
        help="This process's memory on the device as the driver counts it: NVML nvmlDeviceGetComputeRunningProcesses() usedGpuMemory of this PID; on AMD, memory_usage.vram_mem of this PID in amdsmi_get_gpu_process_list(). Everything the process holds there: the allocator's reserved bytes, the CUDA/HIP context, library workspaces, NCCL/RCCL buffers. NaN when the driver cannot say (a container's PID namespace hides this PID from it; NVML_VALUE_NOT_AVAILABLE, amdsmi's N/A). Not on Intel or Apple devices.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.process_used",
        cuda=True,
        detail=True,
    ),
    _g(
        "device_non_allocator_bytes",
        unit="bytes",
        help=f"Device memory this process holds outside PyTorch's caching allocator (CUDA/HIP context, cuBLAS/cuDNN or rocBLAS/MIOpen workspaces, NCCL/RCCL buffers, other libraries): device_process_used_bytes - {_MS}['reserved_bytes.all.current'], at least 0. Absent when the driver cannot say.",
        labels=DEVICE,
        collector="device",
        otel="memexporter.device.non_allocator",
        cuda=True,
    ),
    _g(
        "device_info",
        unit="",
        help="Device identity (value 1), matched to torch's ordinal by UUID: uuid as the driver library spells it (NVML: GPU-... or MIG-...), name (model), pci_bus_id (the PCI address), gpu_uuid and gpu_instance_id (the physical GPU and MIG GPU instance, as dcgm-exporter's UUID and GPU_I_ID labels; gpu_instance_id empty on a whole GPU), vendor (nvidia, amd or intel: ROCm's GPUs are cuda:N to torch).",
        labels=("rank", "device", "uuid", "name", "pci_bus_id", "gpu_uuid", "gpu_instance_id", "vendor"),
        collector="device",
        otel="memexporter.device.info",
        cuda=True,
    ),
)


HOST_SPECS: tuple[MetricSpec, ...] = (
    # --- Host, from psutil and cgroup files (collectors/host.py).
    _g(
        "host_rss_bytes",
        unit="bytes",
        help="Resident set size of this process: psutil memory_info().rss.",
        labels=RANK,
        collector="host",
        otel="memexporter.host.rss",
        semconv=SemConv("process.memory.usage", "process"),
    ),
    _g(
        "host_children_rss_bytes",
        unit="bytes",
        help="Summed RSS of all descendant processes (DataLoader workers), from /proc/PID/task/*/children and /proc/PID/statm (psutil as the fallback).",
        labels=RANK,
        collector="host",
        otel="memexporter.host.children_rss",
    ),
    _g(
        "host_available_bytes",
        unit="bytes",
        help="Memory available to this process: min(psutil virtual_memory().available, cgroup limit - cgroup usage).",
        labels=RANK,
        collector="host",
        otel="memexporter.host.available",
    ),
    _g(
        "host_limit_bytes",
        unit="bytes",
        help="Memory limit for this process: min(physical RAM, cgroup memory.max / memory.limit_in_bytes).",
        labels=RANK,
        collector="host",
        otel="memexporter.host.limit",
    ),
)
