"""Parsers for the config knobs' values (``config.KNOBS``): one per kind of value.

Each takes the name to put in an error (the keyword, or the ``MEMEXPORTER_*`` variable the value
came from) and the value, and returns it normalised or raises ``TypeError``/``ValueError``
naming both.
"""

from __future__ import annotations

import ipaddress
import os
import re


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


def port(name: str, value: object) -> int:
    """A TCP port, 0-65535 (0: any free port)."""
    return _int(name, value, 0, 65535)


def positive(name: str, value: object) -> int:
    """An integer >= 1, from an int or a string (an environment variable's)."""
    return _int(name, value, 1)


def non_negative(name: str, value: object) -> int:
    """An integer >= 0, from an int or a string."""
    return _int(name, value, 0)


def window(name: str, value: object) -> int:
    """The leak window's length in steps: an integer 8-100000."""
    return _int(name, value, 8, 100_000)


def opt_positive(name: str, value: object) -> int | None:
    """An integer >= 1, or None when unset (``None`` or an empty string)."""
    return None if value is None or value == "" else positive(name, value)


# IEC units are powers of 1024 (PyTorch prints GiB; Kubernetes spells them Ki, Mi, Gi, Ti), SI units
# powers of 1000. A bare K, M, G or T means either, so it is refused with both readings.
_UNITS = {"b": 1}
for _n, _p in enumerate("kmgt", 1):
    _UNITS.update({f"{_p}ib": 1024**_n, f"{_p}i": 1024**_n, f"{_p}b": 1000**_n})
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def opt_bytes(name: str, value: object) -> int | None:
    """A size in bytes > 0: an int, or a string with a unit (``40GiB``, ``512MiB``, ``40GB``, ``40Gi``)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return positive(name, value)
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit not in _UNITS and unit not in ("", "k", "m", "g", "t")):
        raise ValueError(
            f"memexporter: {name} must be a size in bytes (40GiB, 512MiB, 40GB or 42949672960), got {value!r}"
        )
    number = float(match.group(1))
    if unit in ("k", "m", "g", "t"):
        iec, si = f"{match.group(1)}{unit.upper()}iB", f"{match.group(1)}{unit.upper()}B"
        raise ValueError(
            f"memexporter: {name} got {value!r}: say {iec} ({int(number * _UNITS[unit + 'ib'])} bytes) "
            f"or {si} ({int(number * _UNITS[unit + 'b'])} bytes)"
        )
    if unit == "" and not match.group(1).isdigit():
        raise ValueError(f"memexporter: {name} must be a whole number of bytes or have a unit, got {value!r}")
    size = int(number * _UNITS[unit or "b"])
    if size < 1:
        raise ValueError(f"memexporter: {name} must be at least 1 byte, got {value!r}")
    return size


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def boolean(name: str, value: object) -> bool:
    """A bool, or a string among ``1/true/yes/on`` and ``0/false/no/off`` (any case, blanks around ignored)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ValueError(f"memexporter: {name} must be a boolean ({'/'.join(TRUE)} or {'/'.join(FALSE)}), got {value!r}")


def addr(name: str, value: object) -> str:
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
        raise ValueError(
            f"memexporter: {name} must be an IP address such as {hint}, got {value!r} "
            "(host names are not resolved, so that start() never waits on DNS)"
        ) from None
    return value


def opt_path(name: str, value: object) -> str | None:
    """The path of an existing file, as a string; None when unset (``None`` or an empty string)."""
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"memexporter: {name} must be a file path, got {value!r}")
    path = os.fspath(value)
    if not os.path.isfile(path):
        raise ValueError(f"memexporter: {name} file does not exist: {path!r}")
    return str(path)


def fraction(name: str, value: object) -> float:
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


def networks(name: str, value: object) -> tuple[str, ...]:
    """IP networks in CIDR form, comma- or space-separated (or a list); a bare address is a /32 or /128."""
    if isinstance(value, str):
        items = [v for v in value.replace(",", " ").split() if v]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise TypeError(
            f"memexporter: {name} must be networks in CIDR form (a string or a list of strings), got {value!r}"
        )
    out = []
    for item in items:
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(
                f"memexporter: {name} must be networks in CIDR form such as 10.0.0.0/8 or fd00::/8; "
                f"{item!r} in {value!r} is not one"
            ) from None
    return tuple(out)


def opt_dir(name: str, value: object) -> str | None:
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


RANK_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
"""One part of a rank list: ``7`` or ``0-7`` (inclusive)."""


def ranks(name: str, value: object) -> str:
    """``auto``, ``all``, ``none`` or ranks and ranges (``0-7,64``), normalised (lower case, no spaces)."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TypeError(f"memexporter: {name} must be auto, all, none or ranks such as '0-7,64', got {value!r}")
    text = str(value).strip().lower().replace(" ", "")
    if text in ("auto", "all", "none"):
        return text
    for part in text.split(","):
        match = RANK_RANGE.fullmatch(part)
        if match is None or (match.group(2) is not None and int(match.group(2)) < int(match.group(1))):
            raise ValueError(
                f"memexporter: {name} must be auto, all, none or ranks such as 0-7,64; "
                f"{part!r} in {value!r} is not a rank or a range low-high"
            )
    return text


def label_value(name: str, value: object) -> str:
    """A label value that a person chose (a run name): printable, at most 128 characters; "" unset."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"memexporter: {name} must be a string, got {value!r} ({type(value).__name__})")
    text = value.strip()
    if len(text) > 128 or not text.isprintable():
        raise ValueError(f"memexporter: {name} must be printable text of at most 128 characters, got {value!r}")
    return text


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The levels of memexporter's own messages: the commands' ``--log-level`` and ``log_level``."""


def log_level(name: str, value: object) -> str | None:
    """One of ``LOG_LEVELS``, in any case (``debug``, ``Warning``), or None when unset."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError(f"memexporter: {name} must be a str, got {value!r} ({type(value).__name__})")
    if value.strip().upper() not in LOG_LEVELS:
        choices = ", ".join(level.lower() for level in LOG_LEVELS)
        raise ValueError(f"memexporter: {name} must be one of {choices}, got {value!r}")
    return value.strip().upper()
