"""Step boundaries, process-wide: PyTorch's global optimizer hooks and ``memexporter.step()``.

The exporter hands its ``StepTracker`` (steps.py) to ``activate``. Each ``optimizer.step()`` then
marks a boundary (its pre-hook samples the step peak, with the gradients alive), or
``memexporter.step()`` does from its first call on; the same readings open and close the automatic
``optimizer`` phase (phases.py). In a forked child (a DataLoader worker) nothing here does anything.

A DeepSpeed engine steps its inner torch optimizer once per parameter group: the steps counter
then takes the engine's ``global_steps`` (the engine: ``storage/deepspeed.engine_of``), once per engine step,
so gradient accumulation and parameter groups count as DeepSpeed counts. The boundary is the last
group's step (as many as the engine's previous step took; the first engine step's first), and the
``optimizer`` phase stays open from the first group's step to it.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from memexporter.tracking import phases
from memexporter.tracking.steps import StepTracker
from memexporter.tracking.storage import deepspeed

_active: StepTracker | None = None
_owner_pid = os.getpid()
_manual = False
_auto = False
_primary: weakref.ref[Any] | None = None
_hooks_installed = False
# id() of the optimizer whose pre-step hook ran last and whose post-step hook has not counted yet.
# A subclass whose step() calls super().step() runs torch's hook wrapper twice (both classes' step
# are wrapped): pre, pre, post, post. Only the first post after a pre counts; the outer call's
# post finds nothing pending. A step() that raised leaves its pre pending, which the next pre
# overwrites, so nothing stays stuck.
_pending: int | None = None
_engine_step: tuple[int, int] | None = None  # the DeepSpeed engine step under way: (id(engine), its count)
_engine_posts = 0  # its optimizer step calls so far (one per parameter group)
_engine_groups = 1  # how many the previous engine step took
_MORE, _PAST = -1, -2  # _engine_count: before and after the engine step's last group


def activate(tracker: StepTracker | None, auto_step: bool) -> None:
    """Make ``tracker`` the process's tracker (``None``: none) and install the global hooks once.

    The global optimizer hooks are registered on first use and never removed: ``Optimizer.step``
    iterates torch's global hook dicts live, so adding or removing one from another thread (a
    ``stop()`` from a timer, say) can raise "OrderedDict mutated during iteration" into training.
    With no tracker the hooks return at once.
    """
    global _active, _owner_pid, _primary, _manual, _auto, _hooks_installed, _pending, _engine_step
    _active, _owner_pid, _primary, _auto, _pending = tracker, os.getpid(), None, auto_step, None
    _engine_step = None
    if tracker is None:
        _manual = False  # a stopped exporter forgets the manual mode with everything else
    elif not _hooks_installed:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(_on_pre_step)
        register_optimizer_step_post_hook(_on_post_step)
        _hooks_installed = True


def _tracker() -> StepTracker | None:
    # In a forked child (a DataLoader worker) the parent's tracker must do nothing.
    return _active if os.getpid() == _owner_pid else None


def _is_primary(optimizer: object) -> bool:
    # With several optimizers (a GAN, a teacher and a student) one iteration calls several
    # step()s. The first optimizer seen stepping defines the boundary; others only sample.
    global _primary
    current = _primary() if _primary is not None else None
    if current is None:
        try:
            _primary = weakref.ref(optimizer)
        except TypeError:
            return True
        return True
    return current is optimizer


def _on_pre_step(optimizer: object, args: object, kwargs: object) -> None:
    global _pending
    _pending = id(optimizer)
    tracker = _tracker()
    if tracker is not None:
        # Gradients are alive here: often close to the step's peak. The same reading ends the
        # backward phase and opens the optimizer's.
        phases.optimizer_begin(tracker.sample())


def _on_post_step(optimizer: object, args: object, kwargs: object) -> None:
    global _pending
    if _pending != id(optimizer):
        return  # the outer call of a nested step(): its inner call counted this step
    _pending = None
    tracker = _tracker()
    if tracker is None:
        return
    try:
        engine = deepspeed.engine_of(optimizer)  # None at once without DeepSpeed
    except Exception:
        engine = None
    try:
        # An engine's model stands for its optimizers: an engine built again over the same model
        # (DeepSpeed keeps the first one's alive after destroy()) keeps the boundary.
        primary = _is_primary(optimizer if engine is None else getattr(engine, "module", engine))
    except Exception:
        primary = True
    boundary = primary and _auto and not _manual
    count = None
    if boundary and engine is not None:
        try:
            count = _engine_count(engine)
        except Exception:
            count = None
        if count == _MORE:  # more groups of this engine step follow: the optimizer phase stays open
            tracker.sample()
            return
        if count == _PAST:  # a group beyond the previous step's count: counted already
            boundary, count = False, None
        elif count is not None and count <= tracker.steps:  # an engine built again counts from 0: one more
            count = None
    phases.optimizer_end(tracker.step(count) if boundary else tracker.sample())


def _engine_count(engine: object) -> int | None:
    """The DeepSpeed engine step under way (``global_steps + 1``), at its last parameter group's
    step; ``_MORE`` before it, ``_PAST`` after it (the engine took more groups than its previous
    step: the first); None when the engine has no ``global_steps``."""
    global _engine_step, _engine_posts, _engine_groups
    steps = getattr(engine, "global_steps", None)
    if not isinstance(steps, int):
        return None
    count = steps + 1
    if (id(engine), count) != _engine_step:  # a new engine step: the last one took _engine_posts group steps
        if _engine_step is not None:
            _engine_groups = max(1, _engine_posts)
        _engine_step, _engine_posts = (id(engine), count), 0
    _engine_posts += 1
    if _engine_posts == _engine_groups:
        return count
    return _MORE if _engine_posts < _engine_groups else _PAST


def step(count: int | None = None) -> None:
    """Mark a step boundary by hand (``count``: a trainer's global step). From the first call
    on, optimizer steps no longer count, until the exporter stops. With no exporter running it does
    nothing: a call after ``stop()`` (a loop that outlives its exporter) once turned the next
    exporter's step detection off, and it counted no optimizer step at all."""
    global _manual
    tracker = _tracker()
    if tracker is not None:
        _manual = True
        tracker.step(count)


def sample() -> None:
    """Record an intra-step sample. Never raises."""
    tracker = _tracker()
    if tracker is not None:
        tracker.sample()
