"""The framework-neutral half of the callbacks (``lightning.py``, ``transformers.py``); imports no framework.

``Session`` is what both callbacks share: start the exporter (or adopt the
one that runs), track the model, keep the phases opened in one hook and closed in another, turn
the trainer's global step into ``memexporter.step(count=...)``, and note an OOM risk for the next
step boundary. Every callback hook runs its body through ``Session.guard``: a failure of ours is
counted in ``memexporter_hook_errors_total``, logged once, and never raised into training.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import memexporter
from memexporter import exporter as _exporter
from memexporter.config import BY_NAME, resolve_knob
from memexporter.tracking.errors import count_failure, hook_errors

if TYPE_CHECKING:
    from memexporter.api import Phase
    from memexporter.oom.risk import OomRisk, RiskHandle
    from memexporter.tracking.modules import TrackHandle

__all__ = ["INSTALL_HINT", "Session", "import_framework"]

log = logging.getLogger("memexporter")

INSTALL_HINT = "pip install 'memexporter[frameworks]'"
# The keywords a callback passes itself: the model comes from the trainer's hooks.
_RESERVED = ("model", "optimizer")


def import_framework(integration: str, candidates: tuple[tuple[str, str], ...]) -> ModuleType:
    """The first of ``candidates`` (``(module, pip package)``) that imports, else an ``ImportError``
    saying which package to install."""
    missing: list[str] = []
    for module, package in candidates:
        try:
            return importlib.import_module(module)
        except ImportError:
            missing.append(package)
    raise ImportError(
        f"memexporter.integrations.{integration} needs {' or '.join(missing)}: "
        f"pip install {missing[0]} (or {INSTALL_HINT})"
    )


def check_start_kwargs(port: int | None, start_kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError``/``ValueError`` now, when the callback is built, for what ``start()``
    would refuse later inside a hook (where it could only be logged)."""
    reserved = sorted(set(start_kwargs) & set(_RESERVED))
    if reserved:
        raise TypeError(f"memexporter: the callback tracks the trainer's model itself; drop {', '.join(reserved)}=")
    try:
        inspect.signature(memexporter.start).bind(port, **start_kwargs)
    except TypeError as exc:
        raise TypeError(f"memexporter: MemexporterCallback: {exc} (its keywords are start()'s)") from None
    for name, value in {"port": port, **start_kwargs}.items():
        if name in BY_NAME and value is not None:
            resolve_knob(name, value)  # raises ValueError/TypeError naming a bad value


class Session:
    """What one callback holds between hooks. All methods run on the training thread, except the
    OOM-risk function, which only stores the risk."""

    def __init__(
        self, framework: str, port: int | None, save_checkpoint_on_oom_risk: bool, start_kwargs: dict[str, Any]
    ) -> None:
        self.framework = framework
        self.port, self.start_kwargs = port, start_kwargs
        self.save_checkpoint_on_oom_risk = save_checkpoint_on_oom_risk
        self.active = False  # between begin() and end()
        self.owns_exporter = False  # started by us: stopped by us
        self.handle: TrackHandle | None = None  # ours to remove
        self.handled = False  # track() was called (the model may be someone else's)
        self.risk_handle: RiskHandle | None = None
        self.risk: OomRisk | None = None  # noted by the risk function, until acted on
        self.phases: dict[str, Phase] = {}  # the open ones, by name, in the order opened
        self.last_step = -1
        self._logged = False
        self._reraise: BaseException | None = None  # start()'s error under strict=True: the user's to see

    def __getstate__(self) -> dict[str, Any]:
        # A spawn launcher (Lightning's ddp_spawn) pickles the trainer with its callbacks before
        # the first hook: nothing live is held by then, and nothing live may travel.
        state = dict(self.__dict__)
        state.update(
            active=False,
            owns_exporter=False,
            handle=None,
            handled=False,
            risk_handle=None,
            risk=None,
            phases={},
            _reraise=None,
        )
        return state

    # --- never raise into training ----------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, hook: str) -> Iterator[None]:
        """Run a hook body: an exception of ours is counted and logged once, never raised (but
        ``start()``'s under ``strict=True``, which asked for it)."""
        try:
            yield
        except Exception as exc:
            if exc is self._reraise:
                self._reraise = None
                raise
            self.failed(hook)

    def failed(self, hook: str) -> None:
        """Count the exception being handled (``memexporter_hook_errors_total``) and log this
        callback's first one (``count_failure`` logs only the process's first)."""
        before = hook_errors()
        count_failure(f"{self.framework} callback ({hook})")
        if before > 0 and not self._logged:
            log.exception(
                "memexporter: the %s callback failed in %s; training goes on, further failures "
                "are only counted (memexporter_hook_errors_total)",
                self.framework,
                hook,
            )
        self._logged = True

    # --- start and stop -----------------------------------------------------------------------

    def begin(self) -> None:
        """Start the exporter on this rank (``port + LOCAL_RANK``), or adopt the one that runs
        (``memexporter run``, the bootstrap, the user's own ``start()``): that one is left running
        at the end. Registers the OOM-risk function when asked for. Idempotent."""
        if self.active:
            return
        self.active = True
        self.last_step = -1
        if _exporter.running() is None:
            try:
                memexporter.start(port=self.port, **self.start_kwargs)  # a taken port is logged (strict=False)
            except Exception as exc:
                if resolve_knob("strict", self.start_kwargs.get("strict")):
                    self._reraise = exc
                raise
            self.owns_exporter = True
        else:
            log.info(
                "memexporter: the %s callback uses the exporter already running (%s)",
                self.framework,
                _exporter.running(),
            )
        if self.save_checkpoint_on_oom_risk and self.risk_handle is None:
            self.risk_handle = memexporter.on_oom_risk(self._note_risk)

    def track(self, model: Any) -> None:
        """Track ``model`` once. A model tracked already (``start(model=...)``, the user's own
        ``track()``) stays with its owner."""
        if self.handled or model is None:
            return
        self.handled = True
        try:
            self.handle = memexporter.track(model)
        except ValueError as exc:
            if "already tracked" not in str(exc):
                raise
            log.info(
                "memexporter: %s is tracked already; the %s callback leaves it to its owner",
                type(model).__name__,
                self.framework,
            )

    def end(self) -> None:
        """Close the phases left open, untrack, unregister, and stop the exporter if we started
        it. Each part on its own, so one failing does not leave the others behind."""
        with self.guard("end: phases"):
            self.close_all()
        handle, self.handle, self.handled = self.handle, None, False
        if handle is not None:
            with self.guard("end: untrack"):
                handle.remove()
        risk_handle, self.risk_handle = self.risk_handle, None
        self.risk = None
        if risk_handle is not None:
            with self.guard("end: on_oom_risk"):
                risk_handle.remove()
        if self.owns_exporter:
            self.owns_exporter = False
            with self.guard("end: stop"):
                memexporter.stop()
        self.active = False

    # --- phases ---------------------------------------------------------------------------------

    def open(self, name: str) -> None:
        """Enter phase ``name`` unless it is open already (a second begin signal, or a stale one)."""
        if name in self.phases:
            return
        phase = memexporter.phase(name)
        phase.__enter__()
        self.phases[name] = phase

    def close(self, name: str) -> bool:
        """Leave phase ``name`` if open; whether it was."""
        phase = self.phases.pop(name, None)
        if phase is None:
            return False
        phase.__exit__(None, None, None)
        return True

    def close_all(self) -> None:
        """Leave every open phase, innermost (last opened) first."""
        for name in reversed(list(self.phases)):
            self.close(name)

    # --- steps and the OOM risk -----------------------------------------------------------------

    def step(self, global_step: int) -> bool:
        """A step boundary when the trainer's global step moved on since the last one: the steps
        counter takes ``global_step``. Whether it moved."""
        if global_step == self.last_step:
            return False
        self.last_step = global_step
        memexporter.step(count=global_step)
        return True

    def _note_risk(self, risk: OomRisk) -> None:
        # On the training thread, at a step boundary: only note it; the hook that called step()
        # saves through the framework when it gets control back.
        self.risk = risk

    def take_risk(self) -> OomRisk | None:
        """The OOM risk noted since the last call, or None."""
        risk, self.risk = self.risk, None
        return risk

    def should_save(self, step: int, world_size: int, every: int, any_rank: Callable[[bool], bool]) -> str | None:
        """Whether to save a checkpoint now for an OOM risk, at the step boundary ``step``: the
        reason to log, or None. With several ranks they agree first (``any_rank``, a collective
        every rank calls), every ``every`` steps only: an agreement waits for the device."""
        if not self.save_checkpoint_on_oom_risk:
            return None
        noted = self.risk is not None
        if world_size > 1:
            if step % max(1, every):
                return None  # the risk waits for the next agreement
            noted = any_rank(noted)
        risk = self.take_risk()
        if not noted:
            return None
        return "OOM risk on another rank" if risk is None else risk.describe()
