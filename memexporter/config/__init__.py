"""Configuration knobs: every keyword of ``start()`` and its ``MEMEXPORTER_<NAME>`` variable.

``KNOBS`` (``knobs.py``) is the single source of truth; ``Config.resolve`` validates explicit arguments and the
environment with one parser per knob, and the configuration table of docs/configuration.md is rendered from it.
An explicit argument wins over the environment. Bad values raise ``TypeError``/``ValueError``
naming the knob and the value. A bad variable that an argument overrides is still checked: it
does not stop the job, but it is said once as a WARNING (without that argument it would). So is a
``MEMEXPORTER_*`` variable that nothing reads (a typo: the closest known name is suggested).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from memexporter.config import environment
from memexporter.config.environment import AUTOSTART
from memexporter.config.knobs import DEFAULT_PORT, ENV_PREFIX, KNOBS, Knob
from memexporter.config.values import FALSE, TRUE

__all__ = [
    "AUTOSTART",
    "BY_NAME",
    "DEFAULT_PORT",
    "ENV_PREFIX",
    "FALSE",
    "KNOBS",
    "TRUE",
    "Config",
    "Knob",
    "auto_track_default",
    "known_variables",
    "origin",
    "reference_table",
    "resolve_knob",
]

BY_NAME: Mapping[str, Knob] = {k.name: k for k in KNOBS}


@dataclass(frozen=True)
class Config:
    """Resolved settings for one exporter. Field names match ``KNOBS``, which holds the defaults."""

    port: int
    addr: str
    strict: bool
    certfile: str | None
    keyfile: str | None
    memory_limit_bytes: int | None
    leak_window: int
    warmup_steps: int
    max_input_elements: int | None
    auto_step: bool
    module_depth: int
    max_modules: int
    auto_track: bool
    otel: bool
    http: bool
    end_grace: int
    debug: bool
    debug_allow: tuple[str, ...]
    record_history: bool
    oom_dump_dir: str | None
    census_every: int
    census_budget: float
    run_id: str
    log_level: str | None
    detail_ranks: str

    @classmethod
    def resolve(cls, explicit: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None) -> Config:
        """Merge explicit arguments (``None`` means unset) over ``MEMEXPORTER_*`` variables over defaults."""
        env = os.environ if environ is None else environ
        explicit = explicit or {}
        unknown = set(explicit) - set(BY_NAME)
        if unknown:
            raise TypeError(f"memexporter: unknown setting(s) {sorted(unknown)}; known: {sorted(BY_NAME)}")
        environment.warn_unknown_variables(env, known_variables())
        values = {knob.name: resolve_knob(knob.name, explicit.get(knob.name), env) for knob in KNOBS}
        if (values["certfile"] is None) != (values["keyfile"] is None):
            raise ValueError("memexporter: certfile and keyfile must be given together")
        return cls(**values)


def resolve_knob(name: str, explicit: object = None, environ: Mapping[str, str] | None = None) -> Any:
    """One knob alone: the explicit value, else ``MEMEXPORTER_<NAME>``, else the default.

    For callers that use a single setting (``track()`` reads ``module_depth``): a bad value of an
    unrelated variable must not fail them. The variable is checked even when ``explicit`` wins:
    a bad one is said once as a WARNING (the job goes on).
    """
    knob = BY_NAME[name]
    env = os.environ if environ is None else environ
    if explicit is not None:
        value = knob.parse(knob.name, explicit)
        environment.check_overridden(knob.name, knob.env, value, env, knob.parse)
        return value
    if env.get(knob.env, "") != "":
        return knob.parse(knob.env, env[knob.env])
    return knob.default


def origin(name: str, explicit: object = None, environ: Mapping[str, str] | None = None) -> str:
    """Where a knob's value comes from: ``argument``, ``environment`` or ``default`` (for advice
    that names the place to change it)."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return "argument"
    return "environment" if env.get(BY_NAME[name].env, "") != "" else "default"


def known_variables() -> frozenset[str]:
    """Every ``MEMEXPORTER_*`` variable the exporter reads."""
    return frozenset(k.env for k in KNOBS) | environment.OTHER_VARIABLES


def auto_track_default(explicit: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """``auto_track`` where no model can be named (``memexporter run``, the bootstrap): on, unless
    the option or ``MEMEXPORTER_AUTO_TRACK`` says otherwise (a bad value raises, naming it)."""
    env = os.environ if environ is None else environ
    if explicit is None and env.get(BY_NAME["auto_track"].env, "") == "":
        return True
    return bool(resolve_knob("auto_track", explicit, env))


def reference_table() -> str:
    """The configuration table of docs/configuration.md, rendered from ``KNOBS``."""
    lines = ["| keyword | environment variable | default | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | `{k.env}` | `{k.default!r}` | {k.doc} |")
    return "\n".join(lines)


assert [f.name for f in fields(Config)] == [k.name for k in KNOBS], "Config fields and KNOBS drifted"
