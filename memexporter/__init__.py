"""memexporter: PyTorch training memory on a Prometheus ``/metrics`` endpoint, in one line.

    import memexporter
    memexporter.start(port=9400)

See the README and docs/ for the metrics, the alert rules and the dashboards.

The public names are imported on first use (PEP 562): ``import memexporter`` alone loads nothing
else, so the HTTP helper process (``memexporter.serving.helper``) imports only its own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memexporter._version import __version__

if TYPE_CHECKING:
    from memexporter.api import Exporter, Phase, on_oom_risk, phase, start, step, step_input, stop, track

__all__ = [
    "Exporter",
    "Phase",
    "__version__",
    "on_oom_risk",
    "phase",
    "start",
    "step",
    "step_input",
    "stop",
    "track",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from memexporter import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memexporter' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
