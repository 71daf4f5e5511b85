"""Configuration knobs: every keyword of ``start()`` and its ``MEMEXPORTER_<NAME>`` variable.

``KNOBS`` is the single source of truth; ``Config.resolve`` validates explicit arguments and the
environment with one parser per knob, and the README's configuration table is rendered from it.
An explicit argument wins over the environment. Bad values raise ``TypeError``/``ValueError``
naming the knob and the value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "MEMEXPORTER_"
DEFAULT_PORT = 9400


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    # bool is an int subclass; port=True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"memexporter: {name} must be an int, got {value!r} ({type(value).__name__})")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"memexporter: {name} must be an integer, got {value!r}") from None
    if n < lo or (hi is not None and n > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"memexporter: {name} must be {bound}, got {value!r}")
    return n


def _port(name: str, value: object) -> int:
    return _int(name, value, 0, 65535)


def _positive(name: str, value: object) -> int:
    return _int(name, value, 1)


def _non_negative(name: str, value: object) -> int:
    return _int(name, value, 0)


def _window(name: str, value: object) -> int:
    return _int(name, value, 8, 100_000)


def _opt_positive(name: str, value: object) -> int | None:
    return None if value is None or value == "" else _positive(name, value)


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        return value.strip().lower() in {"1", "true", "yes", "on"}
    raise ValueError(f"memexporter: {name} must be a boolean (true/false/1/0), got {value!r}")


def _str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"memexporter: {name} must be a non-empty string, got {value!r}")
    return value


def _opt_path(name: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"memexporter: {name} must be a file path, got {value!r}")
    path = os.fspath(value)
    if not os.path.isfile(path):
        raise ValueError(f"memexporter: {name} file does not exist: {path!r}")
    return str(path)


@dataclass(frozen=True)
class Knob:
    """One setting: its parser, default and documentation."""

    name: str
    parse: Callable[[str, object], Any]
    default: Any
    doc: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


KNOBS: tuple[Knob, ...] = (
    Knob("port", _port, DEFAULT_PORT, "Base TCP port. Each rank binds port + LOCAL_RANK. 0 picks a free port (tests)."),
    Knob("addr", _str, "0.0.0.0", "Bind address. All interfaces by default, as exporters do; use 127.0.0.1 on shared login nodes."),
    Knob("strict", _bool, False, "Raise instead of logging when the port is taken or the server cannot start."),
    Knob("certfile", _opt_path, None, "TLS certificate (PEM), passed to prometheus_client. Needs keyfile."),
    Knob("keyfile", _opt_path, None, "TLS private key (PEM), passed to prometheus_client. Needs certfile."),
    Knob("memory_limit_bytes", _opt_positive, None, "Soft budget (bytes) that caps memory_limit_bytes for the devices the job trains on (CUDA if any is in use, else cpu)."),
    Knob("leak_window", _window, 200, "Steps in the leak-rate window (ring buffer; 8..100000)."),
    Knob("warmup_steps", _non_negative, 20, "Steps ignored at the start of the run and after a restart (allocator and cache warm-up); so are the first 5 s."),
    Knob("auto_step", _bool, True, "Count every optimizer.step() as a step boundary. memexporter.step() turns this off."),
    Knob("module_depth", _positive, 3, "Deepest module path reported by track(); deeper modules fold into their ancestor."),
    Knob("max_modules", _positive, 100, "Most module rows per tracked model; the smallest fold into their parent."),
)

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
    auto_step: bool
    module_depth: int
    max_modules: int

    @classmethod
    def resolve(cls, explicit: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None) -> Config:
        """Merge explicit arguments (``None`` means unset) over ``MEMEXPORTER_*`` variables over defaults."""
        env = os.environ if environ is None else environ
        explicit = explicit or {}
        unknown = set(explicit) - set(BY_NAME)
        if unknown:
            raise TypeError(f"memexporter: unknown setting(s) {sorted(unknown)}; known: {sorted(BY_NAME)}")
        values = {knob.name: resolve_knob(knob.name, explicit.get(knob.name), env) for knob in KNOBS}
        if (values["certfile"] is None) != (values["keyfile"] is None):
            raise ValueError("memexporter: certfile and keyfile must be given together")
        return cls(**values)


def resolve_knob(name: str, explicit: object = None, environ: Mapping[str, str] | None = None) -> Any:
    """One knob alone: the explicit value, else ``MEMEXPORTER_<NAME>``, else the default.

    For callers that use a single setting (``track()`` reads ``module_depth``): a bad value of an
    unrelated variable must not fail them.
    """
    knob = BY_NAME[name]
    env = os.environ if environ is None else environ
    if explicit is not None:
        return knob.parse(knob.name, explicit)
    if env.get(knob.env, "") != "":
        return knob.parse(knob.env, env[knob.env])
    return knob.default


def reference_table() -> str:
    """The README's configuration table, rendered from ``KNOBS``."""
    lines = ["| keyword | environment variable | default | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | `{k.env}` | `{k.default!r}` | {k.doc} |")
    return "\n".join(lines)


assert [f.name for f in fields(Config)] == [k.name for k in KNOBS], "Config fields and KNOBS drifted"
