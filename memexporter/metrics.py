"""The metric spec table: the single source of truth for every series memexporter exports.

Collectors build their families from these specs, the OTel adapter and the metrics
reference (docs/metrics.md) are derived from them, and tests check dashboards and rules against them. Add a row
here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# Why a connection ended without a full answer: the `reason` label values of
# memexporter_http_dropped_connections_total (each exported from 0) and their meaning (its HELP).
REASONS: dict[str, str] = {
    "timeout": "the per-connection deadline passed",
    "reset": "the client closed or reset it first",
    "tls": "the TLS handshake failed",
    "evicted": "a slow client dropped at the connection cap to make room for a waiting one",
    "fd_limit": "refused near the process's descriptor limit",
    "write": "the client closed or reset it while its answer was being written",
    "error": "anything else, logged at debug level",
}


MetricType = Literal["gauge", "counter"]

RANK = ("rank",)
DEVICE = ("rank", "device")
MODULE = ("rank", "module")
PHASE = ("rank", "phase")
DEVICE_PHASE = ("rank", "device", "phase")

# The UCUM unit of each Prometheus base unit, as OpenTelemetry spells it. otlptranslator's unit
# suffixes map them back (By -> bytes, s -> seconds, By/s -> bytes_per_second; a `{...}`
# annotation adds nothing; "1" on a gauge adds `_ratio`). "" stays "": a dimensionless value that
# is not a ratio (an `_info` row, a success flag) must not gain `_ratio` on the way.
UCUM: Mapping[str, str] = {
    "bytes": "By",
    "seconds": "s",
    "bytes_per_second": "By/s",
    "bytes_per_step": "By/{step}",
    "ratio": "1",
    "": "",
}


@dataclass(frozen=True)
class SemConv:
    """An OpenTelemetry semantic-convention instrument that reports the same value as a row.

    Emitted beside the row's own instrument (whose name translates back to the Prometheus name).
    ``attributes`` says how its attributes are built: ``"hw.gpu"``: ``hw.id`` (the NVML UUID),
    ``hw.type="gpu"``, ``hw.name`` and ``hw.vendor``, joined from ``memexporter_device_info`` by device;
    ``"process"``: none (the process is the resource). Its unit is the row's OTel unit.
    """

    name: str
    attributes: Literal["hw.gpu", "process"]
    instrument: Literal["updowncounter"] = "updowncounter"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family.

    ``name`` is the full exposition name (counters include ``_total``); ``unit`` is the base unit
    (``bytes``, ``seconds``, ``ratio``...) or ``""``; ``help`` says where the value comes from.
    ``cuda_only`` marks series that exist only when a CUDA device is in use, ``sharded_only`` those
    that exist only for a tracked model with sharded (DTensor) parameters, ``detail`` those that
    only the detail ranks export once a run has 64 ranks or more (``collectors/fleet.py``: module rows, and
    figures that are diagnostic or derivable from the core set). ``otel_name`` and
    ``otel_unit`` (UCUM) name the OpenTelemetry instrument (an observable counter for a counter, an
    observable gauge otherwise) so that otlptranslator's names give back ``name``; ``semconv`` adds
    a semantic-convention instrument with the same value.
    """

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...]
    collector: str
    otel_name: str
    cuda_only: bool = False
    otel_unit: str = ""
    semconv: SemConv | None = None
    sharded_only: bool = False  # exported only for a tracked model with DTensor parameters
    detail: bool = False  # at world >= 64, only the detail ranks export it (memexporter/collectors/fleet.py)

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """A fresh, empty Prometheus family for this spec (built anew on every scrape)."""
        if self.type == "counter":
            # CounterMetricFamily appends `_total` itself; strip it so the name round-trips.
            return CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=self.labels)
        # unit= adds the OpenMetrics `# UNIT` line; our names already end with their unit.
        return GaugeMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)


def _g(
    name: str,
    *,
    unit: str,
    help: str,
    labels: tuple[str, ...],
    collector: str,
    otel: str,
    cuda: bool = False,
    semconv: SemConv | None = None,
    sharded: bool = False,
    detail: bool = False,
) -> MetricSpec:
    return MetricSpec(
        f"memexporter_{name}", "gauge", unit, help, labels, collector, otel, cuda, UCUM[unit], semconv, sharded, detail
    )


def _c(
    name: str,
    *,
    help: str,
    labels: tuple[str, ...],
    collector: str,
    otel: str,
    cuda: bool = False,
    counts: str = "",
    detail: bool = False,
) -> MetricSpec:
    """A counter; ``counts`` is the UCUM annotation of what it counts (``{step}``), dropped by the translation."""
    return MetricSpec(
        f"memexporter_{name}_total", "counter", "", help, labels, collector, otel, cuda, counts, detail=detail
    )


_MS = "torch.cuda.memory_stats()"

SPECS: tuple[MetricSpec, ...] = (
    # --- The OOM view: the same for every device (collectors/memory.py, collectors/trend.py).
    _g(
        "memory_used_bytes",
        unit="bytes",
        help=f"Memory in use. cuda (NVIDIA, AMD), xpu, mps: {_MS}['allocated_bytes.all.current'] of that device's allocator; cpu: process RSS (psutil).",
        labels=DEVICE,
        collector="memory",
        otel="memexporter.memory.used",
    ),
    _g(
        "memory_limit_bytes",
        unit="bytes",
        help="Most that committed (memory_committed_bytes) can reach before an OOM: held plus free to this process. cuda and xpu: reserved + device free (NVML, amdsmi or Level Zero, else the allocator's mem_get_info), capped by the per-process memory fraction; mps: reserved + what Metal's recommended working set leaves (torch.accelerator.get_memory_info); cpu: RSS + available (cgroup-aware). Capped by memory_limit_bytes= when set.",
        labels=DEVICE,
        collector="memory",
        otel="memexporter.memory.limit",
    ),
    _g(
        "memory_committed_bytes",
        unit="bytes",
        help=f"Memory the limit is met by: what the caching allocator cannot hand back, compared with memory_limit_bytes by fullness, the OOM ETA and the alerts. cuda (native allocator), xpu: {_MS}['allocated_bytes.all.current'] + ['inactive_split_bytes.all.current'] (free blocks stranded in partly used segments); cuda with expandable_segments:True: ['reserved_bytes.all.current']; cudaMallocAsync and mps: allocated; cpu: process RSS.",
        labels=DEVICE,
        collector="memory",
        otel="memexporter.memory.committed",
    ),
    _g(
        "memory_peak_bytes",
        unit="bytes",
        help="Highest used within the last completed step: the lifetime high-water mark when it rose during the step (exact); otherwise the step's start plus the excursion of the last exactly measured step, capped by the high-water mark and never below a sample taken in the step (an estimate). Peak stats are never reset.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.memory.peak",
    ),
    _g(
        "memory_baseline_bytes",
        unit="bytes",
        help="used at the last step boundary (after the optimizer step): the footprint that persists between steps.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.memory.baseline",
    ),
    _g(
        "memory_committed_peak_bytes",
        unit="bytes",
        help="Highest committed bytes within the last completed step: memory_peak_bytes plus what was committed beyond used at the step's boundary (memory_committed_bytes - memory_used_bytes). The level the OOM gates compare with the limit.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.memory.committed_peak",
    ),
    _g(
        "leak_rate_bytes_per_second",
        unit="bytes_per_second",
        help="Robust (Theil-Sen) slope of the baseline against wall time over the leak window; 0 until enough steps or when within noise.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.leak.rate",
    ),
    _g(
        "leak_bytes_per_step",
        unit="bytes_per_step",
        help="Robust (Theil-Sen) slope of the baseline against step count over the leak window; 0 until enough steps or when within noise.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.leak.bytes_per_step",
    ),
    _g(
        "oom_eta_seconds",
        unit="seconds",
        help="Seconds until the committed step peak (memory_committed_peak_bytes) reaches memory_limit_bytes at the faster of two robust trends, the baseline's and the committed bytes'; +Inf when neither grows beyond its noise.",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.oom.eta",
    ),
    _g(
        "allocator_recoverable_bytes",
        unit="bytes",
        help="Bytes that PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would likely recover: what is stranded in partly used segments (memory_committed_bytes - memory_used_bytes) while that is over 10 % of the limit and growing over the leak window; 0 otherwise. Native allocator only (the remedy does not apply elsewhere).",
        labels=DEVICE,
        collector="trend",
        otel="memexporter.allocator.recoverable",
        cuda=True,
        detail=True,
    ),
    _c(
        "steps",
        help="Training steps seen (optimizer steps, or memexporter.step() calls).",
        labels=RANK,
        collector="trend",
        otel="memexporter.steps",
        counts="{step}",
    ),
    _g(
        "last_step_timestamp_seconds",
        unit="seconds",
        help="Unix time of the last step boundary; absent before the first step. time() minus this, against step_interval_seconds, tells a stalled run from a slow one.",
        labels=RANK,
        collector="trend",
        otel="memexporter.last_step_timestamp",
    ),
    _g(
        "step_interval_seconds",
        unit="seconds",
        help="Median wall time between the last 32 step boundaries: the run's own step rhythm; absent before two steps.",
        labels=RANK,
        collector="trend",
        otel="memexporter.step.interval",
    ),
    # --- Phases (collectors/phases.py): memexporter.phase() and the automatic forward/backward/optimizer.
    _g(
        "phase_peak_bytes",
        unit="bytes",
        help="Highest used during the last completed occurrence of the phase: the lifetime high-water mark when it rose during the phase (exact; cuda: allocated_bytes.all.peak, cpu: ru_maxrss), otherwise the highest sample taken at its boundaries and inside it (a lower bound). Peak stats are never reset.",
        labels=DEVICE_PHASE,
        collector="phases",
        otel="memexporter.phase.peak",
    ),
    _g(
        "phase_duration_seconds",
        unit="seconds",
        help="Wall time of the last completed occurrence of the phase.",
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.duration",
    ),
    _c(
        "phase_completed",
        help='Completed occurrences of the phase (distinct phase names beyond the first 16 count as phase="other", but eval, validation, test, predict and checkpoint keep theirs).',
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.completed",
        counts="{occurrence}",
    ),
    _g(
        "phase_active",
        unit="",
        help="1 while the phase is open (nested phases: each open one), else 0.",
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.active",
    ),
    _g(
        "phase_last_change_timestamp_seconds",
        unit="seconds",
        help="Unix time a phase last began or ended; absent before the first phase.",
        labels=RANK,
        collector="phases",
        otel="memexporter.phase.last_change_timestamp",
        detail=True,
    ),
    # --- CUDA caching allocator (collectors/allocator.py), read at scrape time.
    _g(
        "allocator_allocated_bytes",
        unit="bytes",
        help=f"Bytes held by live tensors: {_MS}['allocated_bytes.all.current'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.allocated",
        cuda=True,
        detail=True,
    ),
    _g(
        "allocator_reserved_bytes",
        unit="bytes",
        help=f"Bytes reserved from the driver by the caching allocator: {_MS}['reserved_bytes.all.current'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.reserved",
        cuda=True,
    ),
    _g(
        "allocator_active_bytes",
        unit="bytes",
        help=f"Bytes in active blocks: {_MS}['active_bytes.all.current'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.active",
        cuda=True,
        detail=True,
    ),
    _g(
        "allocator_inactive_split_bytes",
        unit="bytes",
        help=f"Bytes in inactive, non-releasable split blocks (fragmentation): {_MS}['inactive_split_bytes.all.current'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.inactive_split",
        cuda=True,
    ),
    _g(
        "allocator_requested_bytes",
        unit="bytes",
        help=f"Bytes requested by callers before rounding: {_MS}['requested_bytes.all.current'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.requested",
        cuda=True,
        detail=True,
    ),
    _g(
        "allocator_peak_allocated_bytes",
        unit="bytes",
        help=f"Lifetime peak of allocated bytes as torch reports it: {_MS}['allocated_bytes.all.peak'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.peak_allocated",
        cuda=True,
        detail=True,
    ),
    _g(
        "allocator_peak_reserved_bytes",
        unit="bytes",
        help=f"Lifetime peak of reserved bytes as torch reports it: {_MS}['reserved_bytes.all.peak'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.peak_reserved",
        cuda=True,
        detail=True,
    ),
    _g(
        "host_pinned_bytes",
        unit="bytes",
        help="Pinned (page-locked) host memory held by PyTorch's host caching allocator (pin_memory(), non_blocking copies, DataLoader pin_memory=True), in blocks in use and cached: torch.cuda.host_memory_stats()['allocated_bytes.current'] (block sizes rounded up to powers of two). Counted in host_rss_bytes as it is touched; never swapped out.",
        labels=RANK,
        collector="allocator",
        otel="memexporter.host.pinned",
        cuda=True,
    ),
    _g(
        "host_pinned_active_bytes",
        unit="bytes",
        help="Pinned host memory in blocks handed out and not yet reusable (their copies may still run): torch.cuda.host_memory_stats()['active_bytes.current'].",
        labels=RANK,
        collector="allocator",
        otel="memexporter.host.pinned_active",
        cuda=True,
        detail=True,
    ),
    _c(
        "allocator_alloc_retries",
        help=f"cudaMalloc calls retried after flushing the cache: {_MS}['num_alloc_retries'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.alloc_retries",
        cuda=True,
        counts="{retry}",
    ),
    _c(
        "allocator_ooms",
        help=f"Out-of-memory errors raised by the allocator: {_MS}['num_ooms'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.ooms",
        cuda=True,
        counts="{oom}",
    ),
    _c(
        "allocator_device_allocations",
        help=f"cudaMalloc calls: {_MS}['num_device_alloc'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.device_allocations",
        cuda=True,
        counts="{call}",
        detail=True,
    ),
    _c(
        "allocator_device_frees",
        help=f"cudaFree calls: {_MS}['num_device_free'].",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.device_frees",
        cuda=True,
        counts="{call}",
        detail=True,
    ),
    _g(
        "allocator_fragmentation_ratio",
        unit="ratio",
        help="inactive_split_bytes / reserved_bytes from memory_stats(); 0 when nothing is reserved.",
        labels=DEVICE,
        collector="allocator",
        otel="memexporter.allocator.fragmentation",
        cuda=True,
    ),
    _g(
        "allocator_info",
        unit="",
        help="Allocator backend (value 1): torch.cuda.get_allocator_backend(), native, cudaMallocAsync or pluggable. Under cudaMallocAsync only allocated, active and reserved bytes (and their peaks) are exported; a pluggable allocator reports no statistics.",
        labels=("rank", "device", "backend"),
        collector="allocator",
        otel="memexporter.allocator.info",
        cuda=True,
    ),
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
    # --- Per-module breakdown (collectors/modules.py), from snapshots published by the training thread.
    _g(
        "module_parameter_bytes",
        unit="bytes",
        help="Bytes of parameters owned by the module, as this rank holds them (a DTensor's local shard; a tied weight once, in its first owner's row; a view into a shared buffer, its own bytes).",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.parameter",
        detail=True,
    ),
    _g(
        "module_gradient_bytes",
        unit="bytes",
        help="Bytes of .grad tensors of the module's parameters, counted on the training thread at an optimizer step (the first, then at most once a second).",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.gradient",
        detail=True,
    ),
    _g(
        "module_optimizer_state_bytes",
        unit="bytes",
        help="Bytes of optimizer state (e.g. AdamW exp_avg, exp_avg_sq) mapped to the module's parameters, counted like the gradients.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.optimizer_state",
        detail=True,
    ),
    _g(
        "module_parameter_unsharded_bytes",
        unit="bytes",
        help="Bytes of the module's parameters unsharded (their global size), only for a model with sharded (DTensor: FSDP2, tensor parallel) parameters: module_parameter_bytes / this = the share this rank holds. Under FSDP2 also what the all-gather materialises for the module's forward and backward.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.parameter_unsharded",
        sharded=True,
        detail=True,
    ),
    _g(
        "module_activation_bytes",
        unit="bytes",
        help="Bytes saved for backward during the last recorded grad-enabled pass (saved_tensors_hooks; at most one pass a second, and one in eight, is recorded), attributed to the innermost running module; each storage once, parameters (also FSDP's unsharded ones) excluded.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.activation",
        detail=True,
    ),
    _g(
        "module_forward_delta_bytes",
        unit="bytes",
        help="torch.cuda allocated bytes after minus before the module's forward, summed over its calls in the last forward (opt-in: track(cuda_forward_delta=True)). A parent includes its children: not a partition.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.forward_delta",
        cuda=True,
        detail=True,
    ),
    # --- The exporter itself (collectors/exporter.py and the guard in registry.py).
    _g(
        "build_info",
        unit="",
        help="Build information (value 1): memexporter, torch and CUDA versions.",
        labels=("rank", "version", "torch_version", "cuda_version"),
        collector="exporter",
        otel="memexporter.build.info",
    ),
    _g(
        "process_info",
        unit="",
        help="Process identity (value 1): local rank, world size and hostname.",
        labels=("rank", "local_rank", "world_size", "hostname"),
        collector="exporter",
        otel="memexporter.process.info",
    ),
    _g(
        "run_info",
        unit="",
        help="The training run (value 1): run_id from the launcher, run_id_source naming where it came from (memexporter: run_id= or MEMEXPORTER_RUN_ID; torchelastic: TORCHELASTIC_RUN_ID; slurm: SLURM_JOB_ID; master: MASTER_ADDR:MASTER_PORT; process: hostname-pid), and detail: what this rank exports (per_rank: its own full set; representative: the full set for its peers, at 64 ranks and more; core: the core set only).",
        labels=("rank", "run_id", "run_id_source", "detail"),
        collector="exporter",
        otel="memexporter.run.info",
    ),
    _c(
        "hook_errors",
        help="Errors caught in memexporter's training-thread hooks (never raised into training).",
        labels=RANK,
        collector="exporter",
        otel="memexporter.hook.errors",
        counts="{error}",
    ),
    _c(
        "http_dropped_connections",
        help="HTTP connections closed without a full answer, by reason: "
        + "; ".join(f"{k} ({v})" for k, v in REASONS.items())
        + ".",
        labels=("rank", "reason"),
        collector="exporter",
        otel="memexporter.http.dropped_connections",
        counts="{connection}",
        detail=True,
    ),
    # --- The job's end (serving/ending.py): served by the helper process after the job is gone.
    _g(
        "job_end_info",
        unit="",
        help="Present only after the training process ended, while its helper serves the last snapshot (the grace period): how it ended, as far as the helper could establish (value 1). cause: oom_kill (the memory cgroup's OOM killer killed a process of the job's cgroup while it ran: memory.events oom_kill), cuda_oom (an uncaught CUDA out-of-memory error, or one that no completed step followed), signal, exit, unknown (no exit status and no last words: SIGKILL, os._exit or a crash, reaped before the helper read it); exit_code and signal from /proc/PID/stat while the process was a zombie (absent when not established).",
        labels=("rank", "cause", "exit_code", "signal"),
        collector="ending",
        otel="memexporter.job.end.info",
    ),
    _g(
        "job_end_timestamp_seconds",
        unit="seconds",
        help="When the helper saw the training process end (Unix time); present only in the grace period, as job_end_info.",
        labels=RANK,
        collector="ending",
        otel="memexporter.job.end.timestamp",
    ),
    _g(
        "collector_success",
        unit="",
        help="1 if the collector's last run succeeded, 0 if it raised or could read only part of its series (the part it read is still exported).",
        labels=("rank", "collector"),
        collector="guard",
        otel="memexporter.collector.success",
    ),
    _g(
        "collector_duration_seconds",
        unit="seconds",
        help="Time the collector's last run took.",
        labels=("rank", "collector"),
        collector="guard",
        otel="memexporter.collector.duration",
        detail=True,
    ),
)

BY_NAME: Mapping[str, MetricSpec] = {s.name: s for s in SPECS}


def spec(name: str) -> MetricSpec:
    """Look up a spec by its full exposition name; KeyError names the missing metric."""
    return BY_NAME[name]


def specs_for(collector: str) -> tuple[MetricSpec, ...]:
    """The specs one collector emits, in table order."""
    return tuple(s for s in SPECS if s.collector == collector)


def families(rows: Mapping[str, Iterable[tuple[tuple[str, ...], float]]]) -> list[Metric]:
    """Build families from ``{metric name: [(label values, value), ...]}``.

    Families without rows are still emitted only if they have rows: a collector with no data
    (say, no CUDA device) yields nothing rather than empty families.
    """
    out: list[Metric] = []
    for name, samples in rows.items():
        fam = spec(name).family()
        for labels, value in samples:
            fam.add_metric(list(labels), value)
        if fam.samples:
            out.append(fam)
    return out


def reference_table() -> str:
    """The metrics reference of docs/metrics.md, rendered from the table (a test keeps them equal)."""
    lines = ["| name | type | unit | labels | help |", "|---|---|---|---|---|"]
    for s in SPECS:
        labels = ", ".join(s.labels)
        extra = " (CUDA only)" if s.cuda_only else " (sharded models only)" if s.sharded_only else ""
        extra += " (detail: at 64 ranks and more, the detail ranks only)" if s.detail else ""
        lines.append(f"| `{s.name}` | {s.type} | {s.unit or '-'} | {labels} | {s.help}{extra} |")
    return "\n".join(lines)
