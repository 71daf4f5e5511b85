"""``memexporter dashboards``: the Grafana dashboards from an installed package, no checkout needed.

    memexporter dashboards --output /var/lib/grafana/dashboards/memexporter   # JSON files
    memexporter dashboards --format configmap --namespace monitoring > dashboards.yaml

The JSON is what ``grafana/dashboards/`` holds (``cli.py`` writes those files in a checkout); the
ConfigMaps carry the Grafana sidecar's label (``memexporter.cli.kube``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memexporter.cli import kube
from memexporter.dashboards.grafana import render
from memexporter.dashboards.panels import build

FORMATS = ("json", "configmap")
DEFAULT_FOLDER = "memexporter-dashboards"  # json without --output: a folder of one file per dashboard


def rendered() -> dict[str, str]:
    """``{file name: JSON text}`` for every dashboard, exactly as committed under grafana/dashboards/."""
    return {name: render(dash) for name, dash in build().items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memexporter dashboards",
        description="Write the memexporter Grafana dashboards as JSON files (for Grafana's file provisioning) "
        "or print them as ConfigMaps for the Grafana chart's dashboard sidecar.",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help="json: one file per dashboard into --output DIR; configmap: a YAML stream of "
        "ConfigMaps (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        type=Path,
        help=f"json: the folder to write into (created; default: ./{DEFAULT_FOLDER}); configmap: a file "
        "(default: stdout)",
    )
    kube.add_metadata_arguments(parser)
    parser.add_argument(
        "--sidecar-label",
        default=kube.SIDECAR_LABEL,
        metavar="KEY=VALUE",
        help="the label the sidecar looks for: the chart's sidecar.dashboards.label and "
        "labelValue (default: %(default)s)",
    )
    parser.add_argument(
        "--annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra metadata annotation, repeatable, e.g. the sidecar's folderAnnotation",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``memexporter dashboards``: the dashboards as JSON files into the ``--output`` folder (default
    ``./memexporter-dashboards``), or with ``--format configmap`` as a YAML stream of ConfigMaps on stdout
    or into the ``--output`` file; what it wrote is said on stderr. Exit 0, or 2 (argparse's) when options
    do not go together or ``--output`` is a file where a folder is needed."""
    parser = _parser()
    args = parser.parse_args(argv)
    files = rendered()
    try:
        if args.format == "json":
            if args.output is None:
                args.output = Path(DEFAULT_FOLDER)
            if args.namespace or args.label or args.annotation or args.sidecar_label != kube.SIDECAR_LABEL:
                raise ValueError(
                    "memexporter: --namespace, --label, --annotation and --sidecar-label apply to --format configmap"
                )
            if args.output.exists() and not args.output.is_dir():
                raise ValueError(f"memexporter: --output {str(args.output)!r} exists and is not a folder")
            args.output.mkdir(parents=True, exist_ok=True)
            for name, text in sorted(files.items()):
                (args.output / name).write_text(text, encoding="utf-8")
            print(
                f"wrote {len(files)} dashboards to {args.output}: {', '.join(sorted(files))} (Grafana: Dashboards > "
                "New > Import, or provision the folder)",
                file=sys.stderr,
            )
            return 0
        text = kube.dashboard_configmaps(
            files,
            args.namespace,
            kube.parse_pairs(args.label),
            kube.parse_pairs(args.annotation, "annotation"),
            args.sidecar_label,
        )
    except ValueError as exc:
        parser.error(str(exc).removeprefix("memexporter: "))  # argparse names the command itself
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}: {len(files)} dashboards as ConfigMaps", file=sys.stderr)
    return 0
