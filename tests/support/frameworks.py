"""Helpers of the per-module tests under real training frameworks (tests/integration/frameworks,
tests/integration/distributed): HF ``Trainer``, Lightning, accelerate, DDP, FSDP2, ``memexporter
run``, torch's ``MemTracker``. The frameworks come with the ``frameworks`` extra (``pip install -e
.[dev]``); a test whose framework is missing is skipped with the reason.

The helpers read ``/metrics`` the way a Prometheus server would (``prometheus_client``'s
parser) and compute what the rows should add up to from the live tensors, by element counts:
never from storages, which is what memexporter reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.web import get_text

FAMILIES = ("parameter", "gradient", "optimizer_state", "activation")
# A wrapper's attribute as a whole dotted part of a row label: DDP/DataParallel/DeepSpeed ``module``,
# torch.compile ``_orig_mod``, FSDP1 ``_fsdp_wrapped_module``, activation checkpointing's wrapper.
WRAPPER_PART = re.compile(r"(^|\.)(module|_orig_mod|_fsdp_wrapped_module|_checkpoint_wrapped_module)(\.|$)")
ADAMW_STEP_BYTES = 4  # AdamW's per-parameter ``step``: a float32 scalar tensor (fused, foreach and for-loop alike)


@dataclass
class Scrape:
    """This process's series of interest, from one ``/metrics`` read."""

    rows: dict[str, dict[str, float]] = field(default_factory=lambda: {f: {} for f in FAMILIES})
    steps: float | None = None
    hook_errors: float | None = None
    collector_success: dict[str, float] = field(default_factory=dict)
    module_series: int = 0  # samples of memexporter_module_* families that carry a ``module`` label

    def total(self, family: str) -> float:
        return sum(self.rows[family].values())

    def labels(self) -> set[str]:
        return {label for family in self.rows.values() for label in family}


def parse(text: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("memexporter_module_") and "module" in s.labels:
                out.module_series += 1
                family = s.name.removeprefix("memexporter_module_").removesuffix("_bytes")
                if family in out.rows:
                    out.rows[family][s.labels["module"]] = s.value
            elif s.name == "memexporter_steps_total":
                out.steps = s.value
            elif s.name == "memexporter_hook_errors_total":
                out.hook_errors = s.value
            elif s.name == "memexporter_collector_success":
                out.collector_success[s.labels.get("collector", "?")] = s.value
    return out


def scrape(url: str) -> Scrape:
    return parse(get_text(url))


def nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def param_bytes(model: Any) -> int:
    """The model's parameter bytes, each storage once (a tied weight is one ``Parameter``; two
    parameters sharing a storage would count the storage once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.setdefault(p.untyped_storage().data_ptr(), nbytes(p))
    return sum(seen.values())


def grad_bytes(model: Any) -> int:
    return sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)


def state_bytes(model: Any, optimizer: Any) -> int:
    """Tensors in ``optimizer.state[p]`` for the model's parameters (``optimizer``: a torch optimizer)."""
    total = 0
    for p in model.parameters():
        for v in optimizer.state.get(p, {}).values():
            if hasattr(v, "element_size"):
                total += nbytes(v)
    return total


def first_owners(model: Any) -> Iterator[tuple[str, Any]]:
    """``(module name, parameter)``, each parameter once, under the module that registers it first
    in ``named_modules()`` order: the row memexporter charges it to (a tied weight, its first owner)."""
    seen: set[int] = set()
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p


def own_param_rows(model: Any, prefix: str = "") -> dict[str, int]:
    """Parameter bytes per module that registers the parameter first in ``named_modules()`` order
    (``(root)`` for the root's own), leaving out modules that hold none: the rows memexporter should
    show when every module is within the tracked depth."""
    rows: dict[str, int] = {}
    for name, p in first_owners(model):
        label = ".".join(x for x in (prefix, name) if x) or "(root)"
        rows[label] = rows.get(label, 0) + nbytes(p)
    return rows


def to_depth(rows: dict[str, int], depth: int) -> dict[str, int]:
    """``rows`` with every module deeper than ``depth`` folded into its ancestor at ``depth`` (the
    candidate rows of ``track(depth=...)``, for a model without wrappers or containers at the cut)."""
    out: dict[str, int] = {}
    for label, value in rows.items():
        key = label if label == "(root)" else ".".join(label.split(".")[:depth])
        out[key] = out.get(key, 0) + value
    return out


def check_common(got: Scrape, hook_errors_before: int) -> None:
    """What every framework run must show: no hook error, every collector up, no wrapper in a
    row's name, the four families present."""
    assert got.hook_errors is not None, "no memexporter_hook_errors_total"
    assert got.hook_errors == hook_errors_before, f"hook errors: {got.hook_errors} (was {hook_errors_before})"
    assert got.collector_success, "no memexporter_collector_success"
    assert all(v == 1 for v in got.collector_success.values()), got.collector_success
    wrapped = {label for label in got.labels() if WRAPPER_PART.search(label)}
    assert not wrapped, f"wrapper path parts in row names: {sorted(wrapped)}"
    for family in FAMILIES:
        assert got.rows[family], f"no memexporter_module_{family}_bytes rows"


# --- Callback tests (tests/integration/frameworks/test_callbacks.py): any sample by name and labels.


@dataclass
class Samples:
    """Every sample of one ``/metrics`` read, by sample name (counters with their ``_total``)."""

    by_name: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def get(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` whose labels include ``labels``; None when there is none."""
        hits = [v for got, v in self.by_name.get(name, []) if all(got.get(k) == x for k, x in labels.items())]
        assert len(hits) <= 1, f"{len(hits)} samples of {name} match {labels}: {self.by_name[name]}"
        return hits[0] if hits else None

    def need(self, name: str, **labels: str) -> float:
        value = self.get(name, **labels)
        assert value is not None, f"no sample {name}{labels}; has {sorted(self.by_name)}"
        return value


def parse_samples(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    out = Samples()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.by_name.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def read_samples(url: str) -> Samples:
    return parse_samples(get_text(url))
