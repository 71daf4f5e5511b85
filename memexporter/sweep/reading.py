"""What one scrape of a run's ``/metrics`` says, and what a run's scrapes add up to.

The sweep reads its child the way Prometheus would: over HTTP, from the exposition. The names come
from the spec table (``metrics.spec`` raises on a name it does not export), so a renamed metric
breaks here, loudly, and not silently in a planning tool.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from memexporter.metrics import spec

STEPS = spec("memexporter_steps_total").name
USED = spec("memexporter_memory_used_bytes").name
LIMIT = spec("memexporter_memory_limit_bytes").name
PEAK = spec("memexporter_memory_peak_bytes").name
BASELINE = spec("memexporter_memory_baseline_bytes").name
PEAK_ALLOCATED = spec("memexporter_allocator_peak_allocated_bytes").name
PEAK_RESERVED = spec("memexporter_allocator_peak_reserved_bytes").name
OOMS = spec("memexporter_allocator_ooms_total").name
HOST_RSS = spec("memexporter_host_rss_bytes").name
# The per-family split of a tracked model: each family summed over its module rows (they partition the model).
SPLIT = {
    "parameters": spec("memexporter_module_parameter_bytes").name,
    "gradients": spec("memexporter_module_gradient_bytes").name,
    "optimizer_state": spec("memexporter_module_optimizer_state_bytes").name,
    "activations": spec("memexporter_module_activation_bytes").name,
}
_PER_DEVICE = (USED, LIMIT, PEAK, BASELINE, PEAK_ALLOCATED, PEAK_RESERVED, OOMS)
# Every series carries labels (rank at least), so `name{` starts exactly its sample lines.
_WANTED = tuple(f"{n}{{" for n in (STEPS, HOST_RSS, *_PER_DEVICE))
_WANTED_SPLIT = _WANTED + tuple(f"{n}{{" for n in SPLIT.values())


@dataclass(frozen=True)
class Reading:
    """One scrape: the step count, ``{metric: {device: value}}`` for the per-device series, the
    host RSS, and the model's split (``None`` when no model is tracked). Bytes throughout."""

    steps: int
    devices: dict[str, dict[str, float]]
    host_rss: float | None
    split: dict[str, float] | None


def parse(text: str, split_too: bool = True) -> Reading:
    """Read the sweep's figures from a Prometheus text exposition.

    Only the lines of the series used are handed to the parser: a sweep polls several times a
    second, and the module rows (a hundred and more) are most of the text. ``split_too=False``
    skips them as well (the split has ``None``).
    """
    wanted = _WANTED_SPLIT if split_too else _WANTED
    lines = "\n".join(ln for ln in text.splitlines() if ln.startswith(wanted)) + "\n"
    steps, host_rss = 0.0, None
    per_device: dict[str, dict[str, float]] = defaultdict(dict)
    split: dict[str, float] = {}
    by_name = {v: k for k, v in SPLIT.items()}
    for family in text_string_to_metric_families(lines):
        for s in family.samples:
            if s.name == STEPS:
                steps = max(steps, s.value)
            elif s.name in _PER_DEVICE and "device" in s.labels:
                per_device[s.name][s.labels["device"]] = s.value
            elif s.name == HOST_RSS:
                host_rss = s.value
            elif s.name in by_name:
                split[by_name[s.name]] = split.get(by_name[s.name], 0.0) + s.value
    return Reading(int(steps), dict(per_device), host_rss, split or None)


@dataclass
class Observed:
    """A run's scrapes folded together: lifetime high-water marks keep their highest value, the
    limit its lowest (what was free shrinks when other processes grow), the rest their last."""

    scrapes: int = 0
    steps: int = 0
    peaks: dict[str, float] = field(default_factory=dict)  # device -> highest memory_peak / used seen
    peak_allocated: dict[str, float] = field(default_factory=dict)
    peak_reserved: dict[str, float] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    ooms: float = 0.0
    host_rss: float = 0.0
    split: dict[str, float] | None = None
    split_steps: int = 0  # the step count when the split was last read (0: before any step)

    def add(self, r: Reading) -> None:
        self.scrapes += 1
        self.steps = max(self.steps, r.steps)
        for metric, into in (
            (PEAK, self.peaks),
            (USED, self.peaks),
            (PEAK_ALLOCATED, self.peak_allocated),
            (PEAK_RESERVED, self.peak_reserved),
        ):
            for dev, v in r.devices.get(metric, {}).items():
                into[dev] = max(into.get(dev, 0.0), v)
        for dev, v in r.devices.get(LIMIT, {}).items():
            self.limits[dev] = min(self.limits.get(dev, v), v)
        self.baselines.update(r.devices.get(BASELINE, {}))
        self.ooms = max([self.ooms, *r.devices.get(OOMS, {}).values()])
        self.host_rss = max(self.host_rss, r.host_rss or 0.0)
        if r.split is not None:
            self.split = r.split

    @property
    def device(self) -> str:
        """The device the job trains on: the CUDA device that reserved the most, else ``cpu``."""
        cuda = [d for d in self.peaks if d != "cpu"]
        return max(cuda, key=lambda d: self.peak_reserved.get(d, self.peaks[d])) if cuda else "cpu"
