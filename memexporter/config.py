"""Configuration knobs: every keyword of ``start()`` and its ``MEMEXPORTER_<NAME>`` variable.

``KNOBS`` is the single source of truth; ``Config.resolve`` validates explicit arguments and the
environment with one parser per knob, and the README's configuration table is rendered from it.
An explicit argument wins over the environment. Bad values raise ``TypeError``/``ValueError``
naming the knob and the value.
"""

from __future__ import annotations

import ipaddress
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


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ValueError(f"memexporter: {name} must be a boolean ({'/'.join(TRUE)} or {'/'.join(FALSE)}), got {value!r}")


def _addr(name: str, value: object) -> str:
    """An IP address to bind. Host names are refused rather than resolved: ``start()`` must never
    wait on DNS. ``localhost`` is the one name taken, as ``127.0.0.1``."""
    if not isinstance(value, str):
        raise TypeError(f"memexporter: {name} must be a string, got {value!r} ({type(value).__name__})")
    if value == "localhost":
        return "127.0.0.1"
    hint = "0.0.0.0 (all interfaces), 127.0.0.1 (this host only), :: or ::1"
    if not value:
        raise ValueError(f"memexporter: {name} is empty; give an IP address such as {hint}")
    if value != value.strip():
        raise ValueError(f"memexporter: {name} has blanks around it: {value!r}")
    if value.startswith("[") and value.endswith("]"):
        raise ValueError(f"memexporter: {name} takes an IPv6 address without brackets, got {value!r}")
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"memexporter: {name} must be an IP address such as {hint}, got {value!r} "
                         "(host names are not resolved, so that start() never waits on DNS)") from None
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


def _fraction(name: str, value: object) -> float:
    """A fraction in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"memexporter: {name} must be a number, got {value!r} ({type(value).__name__})")
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"memexporter: {name} must be a number, got {value!r}") from None
    if not 0 < x <= 1:
        raise ValueError(f"memexporter: {name} must be a fraction above 0 and at most 1, got {value!r}")
    return x


def _networks(name: str, value: object) -> tuple[str, ...]:
    """IP networks in CIDR form, comma- or space-separated (or a list); a bare address is a /32 or /128."""
    if isinstance(value, str):
        items = [v for v in value.replace(",", " ").split() if v]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise TypeError(f"memexporter: {name} must be networks in CIDR form (a string or a list of strings), got {value!r}")
    out = []
    for item in items:
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(f"memexporter: {name} must be networks in CIDR form such as 10.0.0.0/8 or fd00::/8; "
                             f"{item!r} in {value!r} is not one") from None
    return tuple(out)


def _opt_dir(name: str, value: object) -> str | None:
    """A directory that exists and is writable, or can be created (by the exporter, at start)."""
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"memexporter: {name} must be a directory path, got {value!r}")
    path = os.path.abspath(os.fspath(value))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"memexporter: {name} must be a directory, but {existing!r} is a file (from {value!r})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"memexporter: {name} is not writable: {existing!r} (from {value!r})")
    return path


@dataclass(frozen=True)
class Knob:
    """One setting: its parser, default and documentation."""

    name: str
    parse: Callable[[str, object], Any]
    default: Any
    doc: str
    values: str = ""  # the values it takes, for the CLI's help (booleans are --flag/--no-flag there)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def boolean(self) -> bool:
        return self.parse is _bool


KNOBS: tuple[Knob, ...] = (
    Knob("port", _port, DEFAULT_PORT, "Base TCP port. Each rank binds port + LOCAL_RANK. 0 picks a free port (tests).", "an integer 0-65535"),
    Knob("addr", _addr, "0.0.0.0", "Bind address: an IP address of this host (no host names: no DNS at start). All interfaces by default, as exporters do; use 127.0.0.1 on shared login nodes.", "an IP address: 0.0.0.0, 127.0.0.1, ::, ::1, or localhost"),
    Knob("strict", _bool, False, "Raise instead of logging when the port is taken, the server cannot start, or OTLP push cannot be set up."),
    Knob("certfile", _opt_path, None, "TLS certificate (PEM). Needs keyfile; checked at start (a ValueError names a bad file).", "a file path"),
    Knob("keyfile", _opt_path, None, "TLS private key (PEM, unencrypted) matching certfile. Needs certfile.", "a file path"),
    Knob("memory_limit_bytes", _opt_positive, None, "Soft budget (bytes) that caps memory_limit_bytes for the devices the job trains on (CUDA if any is in use, else cpu).", "an integer > 0, in bytes"),
    Knob("leak_window", _window, 200, "Steps in the leak-rate window (ring buffer; 8..100000).", "an integer 8-100000"),
    Knob("warmup_steps", _non_negative, 20, "Steps ignored at the start of the run and after a restart (allocator and cache warm-up); so are the first 5 s.", "an integer >= 0"),
    Knob("auto_step", _bool, True, "Count every optimizer.step() as a step boundary. memexporter.step() turns this off."),
    Knob("module_depth", _positive, 3, "Deepest module path reported by track(); deeper modules fold into their ancestor.", "an integer >= 1"),
    Knob("max_modules", _positive, 100, "Most module rows per tracked model; the smallest fold into their parent.", "an integer >= 1"),
    Knob("auto_track", _bool, False, "Find the model without code and export its module rows: the outermost module whose forward runs with grad enabled and whose parameters an optimizer steps, tracked from the next forward. On by default under memexporter run and the MEMEXPORTER_AUTOSTART bootstrap (which know no model); 0 turns it off there."),
    Knob("otel", _bool, False, "Push the metrics over OTLP, configured by the standard OTEL_EXPORTER_OTLP_* and OTEL_* variables (pip install 'memexporter[otel]'). start(meter_provider=...) uses the application's provider instead."),
    Knob("http", _bool, True, "Serve /metrics over HTTP. False (with otel) runs push-only: no port is opened."),
    Knob("debug", _bool, False, "Serve /debug/memory (tensor census, growing groups and their holders, OOM view) and /debug/snapshot (CUDA allocator snapshot). Loopback clients only, unless debug_allow names theirs."),
    Knob("debug_allow", _networks, (), "Networks besides loopback allowed to read /debug/* (CIDR, comma-separated, e.g. 10.0.0.0/8); other clients get 403.", "CIDR networks, comma-separated"),
    Knob("record_history", _bool, False, "CUDA: record allocation stack traces (torch.cuda.memory._record_memory_history, Python frames, the last 100000 events), so snapshots show who allocated each block. About 2 us per allocation (PyTorch's figure)."),
    Knob("oom_dump_dir", _opt_dir, None, "Directory for the pre-mortem (the census, written once when the OOM ETA drops under 5 minutes or use passes 95 % of the limit) and, on CUDA, the allocator snapshot at an OOM. Created if missing.", "a directory path"),
    Knob("census_every", _positive, 50, "Steps between tensor censuses (with debug or oom_dump_dir), stretched when a census would cost more than census_budget.", "an integer >= 1"),
    Knob("census_budget", _fraction, 0.005, "Most of the training time the censuses may take (0.005: 0.5 %); the census interval stretches to stay under it. 1 turns the stretching off.", "a number above 0, at most 1"),
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
    auto_track: bool
    otel: bool
    http: bool
    debug: bool
    debug_allow: tuple[str, ...]
    record_history: bool
    oom_dump_dir: str | None
    census_every: int
    census_budget: float

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


def auto_track_default(explicit: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """``auto_track`` where no model can be named (``memexporter run``, the bootstrap): on, unless
    the option or ``MEMEXPORTER_AUTO_TRACK`` says otherwise (a bad value raises, naming it)."""
    env = os.environ if environ is None else environ
    if explicit is None and env.get(BY_NAME["auto_track"].env, "") == "":
        return True
    return bool(resolve_knob("auto_track", explicit, env))


def reference_table() -> str:
    """The README's configuration table, rendered from ``KNOBS``."""
    lines = ["| keyword | environment variable | default | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | `{k.env}` | `{k.default!r}` | {k.doc} |")
    return "\n".join(lines)


assert [f.name for f in fields(Config)] == [k.name for k in KNOBS], "Config fields and KNOBS drifted"
