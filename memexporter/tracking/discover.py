"""Find the model to track when the user named none (the ``auto_track`` knob: on under
``memexporter run`` and the ``MEMEXPORTER_AUTOSTART`` bootstrap, which know no model).

The model is the outermost module whose forward runs with grad enabled and whose parameters an
optimizer steps; with several optimizers (a GAN), one such model per optimizer:

- until they are found, a global forward pre-hook and forward hook
  (``torch.nn.modules.module.register_module_forward_pre_hook``) see every module call and keep
  the modules called when no other is running, with grad enabled (a few, by weak reference);
- at each optimizer step (a global step hook, registered once and never removed: see
  ``tracking/steps.py`` for why), the candidate holding most of that optimizer's parameters is
  chosen; once an optimizer steps a second time, every optimizer of the loop has stepped;
- the chosen models are tracked at the next outermost forward, where registering hooks is safe
  (not inside the optimizer's own hook loop), and the module hooks come off: from then on they
  cost nothing.

The hooks run eagerly under ``torch.compile`` (``torch.compiler.disable``: a graph break per
module call while searching, and one recompile when the search ends). A process that never
trains (inference, serving) gives up after ``GIVE_UP_CALLS`` outermost calls and
``GIVE_UP_S`` seconds, with one log line. Nothing here raises into training.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from memexporter.tracking.errors import count_failure
from memexporter.tracking.storage import deepspeed

log = logging.getLogger("memexporter")

GIVE_UP_CALLS = 10_000
"""Outermost module calls (any) without the model found..."""
GIVE_UP_S = 60.0
"""...and seconds since the search began: then stop looking (the global hooks slow every call)."""
_MAX_CANDIDATES = 8


_eager = cast(Callable[[Callable[..., None]], Callable[..., None]], torch.compiler.disable)


class Discovery:
    """Watches module calls and optimizer steps until the models are found; then calls
    ``found(models)`` once, on the training thread, and takes its module hooks off."""

    def __init__(self, found: Callable[[list[nn.Module]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._found_cb, self._pid, self._clock = found, os.getpid(), clock
        self._began = clock()
        self._depth = 0
        self._calls = 0
        self._candidates: dict[int, weakref.ref[nn.Module]] = {}
        self._chosen: list[nn.Module] = []  # one per optimizer that stepped, in order
        self._stepped: set[int] = set()  # id() of the optimizers that stepped
        self._ready = False  # an optimizer stepped twice: every one of the loop has stepped
        self._handles: list[RemovableHandle] = [
            register_module_forward_pre_hook(_eager(self._pre)),
            register_module_forward_hook(_eager(self._post), always_call=True),
        ]

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def close(self) -> None:
        """Stop looking (idempotent). From the training thread, or while no forward runs."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._candidates.clear()
        self._chosen = []

    def _pre(self, module: nn.Module, args: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        try:
            if os.getpid() != self._pid:
                return
            if self._ready:
                chosen = self._chosen
                self.close()
                self._found_cb(chosen)
                return
            self._calls += 1
            if self._calls > GIVE_UP_CALLS and self._clock() - self._began > GIVE_UP_S:
                self.close()
                log.info(
                    "memexporter: auto_track found no model (%d module calls in %.0f s without an optimizer "
                    "step over their parameters); per-module rows need memexporter.track(model) or "
                    "start(model=...)",
                    self._calls,
                    self._clock() - self._began,
                )
                return
            if (
                torch.is_grad_enabled()
                and id(module) not in self._candidates
                and any(p.requires_grad for p in module.parameters())
            ):
                if len(self._candidates) >= _MAX_CANDIDATES:
                    self._candidates.pop(next(iter(self._candidates)))
                self._candidates[id(module)] = weakref.ref(module)
        except Exception:
            count_failure("auto_track forward pre-hook")

    def _post(self, module: nn.Module, args: Any, out: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def on_step(self, optimizer: Optimizer) -> None:
        """At an optimizer step: choose the candidate that holds most of its parameters."""
        try:
            if not self._handles or self._ready or os.getpid() != self._pid:
                return
            if id(optimizer) in self._stepped:  # the loop came round: every optimizer has stepped
                self._ready = bool(self._chosen)
                return
            self._stepped.add(id(optimizer))
            stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
            # DeepSpeed ZeRO steps flat partitions: the engine's module holds the parameters.
            inner = getattr(deepspeed.engine_of(optimizer), "module", None)
            if isinstance(inner, nn.Module):
                stepped |= {id(p) for p in inner.parameters()}
            best, best_n = None, 0
            for ref in list(self._candidates.values()):
                m = ref()
                n = 0 if m is None else sum(id(p) in stepped for p in m.parameters())
                if n > best_n:
                    best, best_n = m, n
            if best is not None and all(best is not c for c in self._chosen):
                self._chosen.append(best)
        except Exception:
            count_failure("auto_track optimizer step hook")


_active: Discovery | None = None
_installed = False


def start(found: Callable[[list[nn.Module]], None]) -> Discovery:
    """Look for the models; ``found(models)`` is called once they are known. Replaces a running search."""
    global _active, _installed
    stop()
    _active = Discovery(found)
    if not _installed:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_on_step)
        _installed = True
    return _active


def track_found(models: list[nn.Module], tracked: list[Any], depth: int, max_modules: int) -> None:
    """Track the models a search found (``track()``, each handle marked ``automatic`` and appended to
    ``tracked`` as it is made: the exporter's list, which ``stop()`` removes), and say so once."""
    from memexporter.tracking.modules import track

    for model in models:
        handle = track(model, None, depth=depth, max_modules=max_modules)
        handle.automatic = True
        tracked.append(handle)
    log.info(
        "memexporter: auto_track: tracking %s (%d module rows at most each)",
        ", ".join(type(m).__name__ for m in models),
        max_modules,
    )


def stop() -> None:
    """End the running search, if any; its step hook then does nothing. Idempotent."""
    global _active
    if _active is not None:
        _active.close()
        _active = None


def _on_step(optimizer: Optimizer, args: object, kwargs: object) -> None:
    d = _active
    if d is not None:
        d.on_step(optimizer)
