"""The OOM view's rows: used, limit and committed memory, the step peaks, the leak rate and the OOM ETA,
the same for every device (collectors/memory.py, collectors/trend.py); the first rows of ``SPECS``.
"""

from __future__ import annotations

from memexporter.metrics.spec import _MS, DEVICE, RANK, MetricSpec, _c, _g

OOM_VIEW_SPECS: tuple[MetricSpec, ...] = (
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
)
