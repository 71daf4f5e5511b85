"""The Overview's ranks row, first part: each rank's device memory against its limit, its leak, and its
caching allocator (reserved, the memory outside it, fragmentation, retries and OOMs).

Bounded at any rank count: each panel shows only the ``$topk`` ranks that matter among those selected
(the fullest, the fastest leak...) or aggregates them. The row's other panels (the host, the steps,
the GPU's other processes, the collectors, the phases) are in ``overview_process.py``; the run's top
in ``overview_run.py``.
"""

from __future__ import annotations

from memexporter.dashboards.grafana import Panel
from memexporter.dashboards.overview_run import ETA
from memexporter.dashboards.scope import COMMITTED_PEAK, JOB, KEY, among, m, picked, scoped, top, worst

RI = "[$__rate_interval]"
_WORST = (
    " Shown for the Top K (rank, device) pairs closest to their limit (step peak / limit) among the "
    "selected ranks at the end of the time range."
)
# The tail of a panel that picks its ranks once, then draws them (``top``, ``among``).
END = ", at the end of the time range: the same ranks over the whole range."


def memory_panels() -> tuple[Panel, ...]:
    """The ranks' memory, bounded: each panel returns at most Top K series (or an aggregate) at any rank count."""
    # A panel of several series per rank picks its Top K ranks once, at the end of the range
    # (picked), and draws each series of those: picked again at each of 720 steps, with a join on
    # run_info each time, one such panel took 3 to 5 s at 1,024 ranks.
    alloc, fullest = "allocator_", worst(pinned=True)
    reserved = picked(m(alloc + "reserved_bytes"))
    return (
        Panel(
            "Memory used, limit and step peak",
            "timeseries",
            "bytes",
            "How close is each rank to its OOM limit? used is live memory (cuda: allocated bytes, cpu: RSS), "
            "committed what fills the limit (allocated plus what is stranded in partly used segments of the "
            "caching allocator), limit what committed can reach before an OOM, peak the highest used in the last "
            "step, baseline what persists between steps." + _WORST,
            tuple(
                (among(m(f"memory_{name}_bytes"), fullest), f"{label} r{{{{rank}}}} {{{{device}}}}")
                for name, label in (
                    ("used", "used"),
                    ("committed", "committed"),
                    ("limit", "limit"),
                    ("peak", "step peak"),
                    ("baseline", "baseline"),
                )
            ),
            w=16,
            h=9,
        ),
        Panel(
            "Time to OOM",
            "stat",
            "s",
            "How long until the committed step peak reaches the limit at the current trend? Infinity means memory "
            "is not growing beyond its own noise. The Top K soonest among the selected ranks.",
            ((f"bottomk($topk, {scoped(m('oom_eta_seconds'))})", "r{{rank}} {{device}}"),),
            w=8,
            h=9,
            instant=True,
            thresholds=ETA,
        ),
        Panel(
            "Headroom at step peak",
            "bargauge",
            "percentunit",
            "What fraction of the limit is still free at the step peak? 1 - committed peak / limit, per rank and "
            "device (the committed peak: the step peak plus what is stranded in partly used segments; an exporter "
            "from before it: its step peak): the Top K with the least among the selected ranks.",
            (
                (
                    f"bottomk($topk, 1 - {scoped(COMMITTED_PEAK)} / {m('memory_limit_bytes')})",
                    "r{{rank}} {{device}}",
                ),
            ),
            w=8,
            instant=True,
            thresholds=(("red", None), ("orange", 0.1), ("green", 0.25)),
        ),
        Panel(
            "Leak rate",
            "timeseries",
            "binBps",
            "Is the memory that persists between steps growing? Robust slope of the baseline over the leak "
            "window; 0 until enough steps and while within noise. The Top K fastest among the selected ranks" + END,
            ((top(m("leak_rate_bytes_per_second")), "r{{rank}} {{device}}"),),
            w=8,
        ),
        Panel(
            "Leak per step",
            "timeseries",
            "bytes",
            "How many bytes does the baseline grow per training step? The same slope against the step count; "
            "the Top K among the selected ranks" + END,
            ((top(m("leak_bytes_per_step")), "r{{rank}} {{device}}"),),
            w=8,
        ),
        Panel(
            "Allocator reserved vs allocated",
            "timeseries",
            "bytes",
            "How much memory does the caching allocator hold beyond live tensors? reserved - allocated is "
            "cache; active includes blocks waiting on streams. The Top K ranks by reserved among those selected, "
            "at the end of the time range; allocated is memory_used_bytes of the accelerator (cuda, xpu or mps: the same figure), "
            "active exists on the detail ranks only from 64 ranks up.",
            (
                (among(m(alloc + "reserved_bytes"), reserved), "reserved r{{rank}} {{device}}"),
                (
                    among(f'memexporter_memory_used_bytes{{{JOB}, device!="cpu"}}', reserved),
                    "allocated r{{rank}} {{device}}",
                ),
                (among(m(alloc + "active_bytes"), reserved), "active r{{rank}} {{device}}"),
            ),
            w=12,
        ),
        Panel(
            "Memory outside the allocator",
            "timeseries",
            "bytes",
            "What does the process hold that PyTorch's caching allocator does not count? Per device, stacked: "
            "the allocator's reserved bytes and, above them, the rest of what the driver counts for this "
            "process (NVML, amdsmi): the CUDA or HIP context, library workspaces, NCCL/RCCL buffers, other libraries. An OOM "
            "with headroom left on the allocator panels is often there. Beside them, the pinned host memory "
            "of the host caching allocator. The Top K ranks closest to their limit at the end of the time "
            "range; absent where the driver cannot see the process (a container's PID namespace).",
            (
                (among(m(alloc + "reserved_bytes"), fullest), "allocator reserved r{{rank}} {{device}}"),
                (among(m("device_non_allocator_bytes"), fullest), "outside the allocator r{{rank}} {{device}}"),
                (among(m("host_pinned_bytes"), fullest, KEY), "pinned host r{{rank}}"),
            ),
            w=12,
            stack=True,
        ),
        Panel(
            "Allocator fragmentation",
            "timeseries",
            "percentunit",
            "How much of the reserved memory is stranded in inactive split blocks? inactive_split / reserved; "
            "high values mean large allocations may fail although memory is free. The Top K selected ranks" + END,
            ((top(m(alloc + "fragmentation_ratio")), "r{{rank}} {{device}}"),),
            w=12,
            thresholds=(("green", None), ("orange", 0.3), ("red", 0.5)),
        ),
        Panel(
            "Allocator retries and OOMs",
            "timeseries",
            "short",
            "Is the allocator thrashing? Retries are cudaMalloc calls retried after flushing the cache (the "
            "classic pre-OOM signal); OOMs are errors raised. Counted per rate interval, the Top K ranks" + END,
            tuple(
                (top(f"increase({m(alloc + name)}{RI})"), f"{label} r{{{{rank}}}} {{{{device}}}}")
                for name, label in (("alloc_retries_total", "retries"), ("ooms_total", "OOMs"))
            ),
            w=12,
        ),
        Panel(
            "Input: largest seen against what fits",
            "timeseries",
            "short",
            "Will the longest batch fit? The largest step input that fits the limit, in elements (learned from the "
            "job's own steps: how the step peak grows with the input, grown with the job's mix of batch and "
            "length), against the largest input seen and the largest the data can bring (max_input_elements, "
            "where declared). The capacity is absent without spread in the inputs (one shape, or a few close "
            "sizes). The Top K ranks closest to their limit" + END,
            (
                (among(m("input_capacity_elements"), fullest), "fits r{{rank}} {{device}}"),
                (among(m("step_input_elements_max"), fullest, KEY), "largest seen r{{rank}}"),
                (among(m("input_declared_max_elements"), fullest, KEY), "declared r{{rank}}"),
            ),
            w=12,
        ),
    )
