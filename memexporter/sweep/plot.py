"""``--plot``: peak against the first axis, one line per value of the other axes, the limit as a line.

matplotlib is an optional extra (``pip install 'memexporter[plot]'``). The figure is drawn
without pyplot, so no GUI backend and no global figure state are involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from memexporter.sweep.fit import MaxFit
from memexporter.sweep.grid import label
from memexporter.sweep.runner import Run, Sweep
from memexporter.units import GiB, MiB

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LIMIT_COLOR = "#d62728"
PREDICTED_COLOR = "#7f7f7f"
OFF_SCALE = 2.0  # a limit more than this many times the highest peak is not drawn to scale
MAX_TICKS = 12  # up to this many values, each gets its own tick on the x axis


def available() -> bool:
    """Whether matplotlib can be imported (``--plot`` needs it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def formats() -> set[str]:
    """The file suffixes matplotlib can write (png, svg, pdf...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())


def plot(sweep: Sweep, mf: MaxFit, path: Path) -> Figure:
    """Draw the sweep into ``path`` (the format follows its suffix: png, svg, pdf) and return the figure."""
    from matplotlib.figure import Figure

    first, rest = sweep.axes[0], [a.name for a in sweep.axes[1:]]
    peaks = [r.peak_bytes for r in sweep.runs if r.peak_bytes is not None]
    limit = sweep.limit_bytes
    # A limit far above every peak (a CPU job's whole RAM) would flatten the lines: it stays in the
    # legend, marked as above the chart, and the axes zoom on the peaks.
    off_scale = limit is not None and bool(peaks) and limit > OFF_SCALE * max(peaks)
    top = max([*peaks, 0.0 if off_scale or limit is None else limit])
    scale, unit = (GiB, "GiB") if top >= 4 * GiB else (MiB, "MiB")

    def x(run: Run) -> float:
        return first.key(run.params[first.name])

    fig = Figure(figsize=(9.5, 4.5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    series: dict[tuple[str, ...], list[Run]] = {}
    for r in sweep.runs:
        if r.peak_bytes is not None:
            series.setdefault(tuple(r.params[n] for n in rest), []).append(r)
    for key, runs in series.items():
        runs.sort(key=x)
        name = label(dict(zip(rest, key, strict=True))) or "peak"
        (line,) = ax.plot(
            [x(r) for r in runs],
            [r.peak_bytes / scale for r in runs if r.peak_bytes is not None],
            marker="o",
            label=name,
        )
        oom = [r for r in runs if r.oom]
        if oom:  # in the series' colour; one legend entry for all series, below
            ax.plot(
                [x(r) for r in oom],
                [r.peak_bytes / scale for r in oom if r.peak_bytes is not None],
                linestyle="none",
                marker="X",
                markersize=11,
                color=line.get_color(),
                label="_nolegend_",
            )
    if any(r.oom and r.peak_bytes is not None for r in sweep.runs):
        ax.plot([], [], linestyle="none", marker="X", markersize=9, color="black", label="ran out of memory")
    if skipped := sorted({x(r) for r in sweep.runs if r.skipped}):
        # Not measured, so no height: marked along the bottom (x in data, y in axes fraction).
        ax.plot(
            skipped,
            [0.03] * len(skipped),
            linestyle="none",
            marker="v",
            color=PREDICTED_COLOR,
            transform=ax.get_xaxis_transform(),
            label="skipped: a smaller size ran out of memory",
        )
    if limit is not None:
        shown = (
            f"limit {limit / scale:.1f} {unit}"
            if not off_scale
            else f"limit {limit / (1 << 30):.1f} GiB (above the chart)"
        )
        ax.axhline(limit / scale, color=LIMIT_COLOR, linestyle="--", label=shown)
        if off_scale:
            ax.set_ylim(min(peaks) / scale * 0.95, max(peaks) / scale * 1.05)
    if mf.predicted.value is not None:
        ax.axvline(
            float(mf.predicted.value),
            color=PREDICTED_COLOR,
            linestyle=":",
            label=f"predicted largest fit: {label({first.name: f'{mf.predicted.value:g}', **mf.predicted.others})}",
        )
    if not first.numeric or len(first.values) <= MAX_TICKS:
        ax.set_xticks([first.key(v) for v in first.values], list(first.values))
    cuda = any(r.device not in (None, "cpu") for r in sweep.runs)
    ax.set_xlabel(first.name)
    ax.set_ylabel(f"peak {'CUDA reserved' if cuda else 'RSS'} ({unit})")
    command = " ".join(sweep.command)
    ax.set_title(command if len(command) <= 80 else command[:77] + "...", fontsize=9)
    ax.grid(alpha=0.3)
    # Beside the axes, not on them: "best" still lands on a line when the lines fill the chart.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.savefig(path)
    return fig
