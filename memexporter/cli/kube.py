"""Kubernetes resources for prometheus-operator and Grafana-sidecar users (kube-prometheus-stack).

- The rules as a ``PrometheusRule`` (``memexporter rules --format prometheusrule``): the operator
  loads the ones its ``Prometheus`` resource selects by label (kube-prometheus-stack's default
  ``ruleSelector`` wants ``release: <helm release name>``, hence ``--label``).
- The dashboards as ConfigMaps (``memexporter dashboards --format configmap``): the Grafana chart's
  sidecar (on in kube-prometheus-stack) loads every ConfigMap carrying its label, by default
  ``grafana_dashboard: "1"``. One ConfigMap per dashboard, as the chart recommends: the sidecar does
  not mirror removals inside a ConfigMap that holds several.

The output is plain YAML with comments, stable byte for byte, so it can be committed and diffed
(``deploy/kubernetes/`` holds the default rendering; a test keeps it in sync). Names, namespaces
and labels are validated as the API server would, so a typo fails here rather than at apply time.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

RULE_FORMATS = ("rules", "prometheusrule")
SIDECAR_LABEL = "grafana_dashboard=1"  # the grafana chart's sidecar.dashboards.label / labelValue defaults
COMMON_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "memexporter", "app.kubernetes.io/part-of": "memexporter"}
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # RFC 1123 label: namespaces (at most 63)
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")  # object names (at most 253)
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")  # label name and value (at most 63)


def _check(kind: str, value: str, pattern: re.Pattern[str], limit: int) -> str:
    if len(value) > limit or not pattern.fullmatch(value):
        raise ValueError(
            f"memexporter: {kind} {value!r} is not valid in Kubernetes "
            f"(at most {limit} characters matching {pattern.pattern})"
        )
    return value


def check_name(name: str) -> str:
    """An object name (``metadata.name``): an RFC 1123 subdomain."""
    return _check("object name", name, _DNS_SUBDOMAIN, 253)


def check_namespace(namespace: str) -> str:
    """A namespace: an RFC 1123 label."""
    return _check("namespace", namespace, re.compile(_DNS_LABEL), 63)


def parse_pairs(items: Iterable[str], what: str = "label") -> dict[str, str]:
    """``["k=v", "prefix/k=v"]`` -> ``{"k": "v", ...}``. Keys are checked as label (or annotation)
    keys, and label values as label values; ValueError names the bad item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"memexporter: {what} {item!r} must be KEY=VALUE, e.g. release=prometheus")
        prefix, slash, name = key.rpartition("/")
        if slash:
            _check(f"{what} key prefix", prefix, _DNS_SUBDOMAIN, 253)
        _check(f"{what} key", name, _LABEL_NAME, 63)
        if what == "label" and value:
            _check("label value", value, _LABEL_NAME, 63)
        out[key] = value
    return out


def _metadata(
    name: str, namespace: str | None, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": check_name(name)}
    if namespace:
        meta["namespace"] = check_namespace(namespace)
    meta["labels"] = {**COMMON_LABELS, **labels}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (dashboard JSON) as literal blocks: readable, diffable and free of escapes."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def dump(obj: Any) -> str:
    """YAML in the order given (kind before spec, as people write it)."""
    return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True))


def prometheus_rule(
    rules_text: str, name: str = "memexporter", namespace: str | None = None, labels: Mapping[str, str] | None = None
) -> str:
    """Wrap a rendered rules file (``rules.render()``) in a ``monitoring.coreos.com/v1`` PrometheusRule.

    The rules file becomes ``spec`` verbatim, indented, so its comments (the parameters it was
    rendered with and the reason for each rule) survive into the resource."""
    head, sep, body = rules_text.partition("\ngroups:\n")
    if not sep or not head.startswith("#"):
        raise ValueError("memexporter: expected a rendered rules file (comment header, then groups:)")
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(name, namespace, labels or {}),
    }
    spec = "".join(f"  {line}\n" if line else "\n" for line in ("groups:\n" + body).splitlines())
    note = "# As a prometheus-operator PrometheusRule: `memexporter rules --format prometheusrule` (memexporter/cli/kube.py)."
    return f"{head}\n{note}\n---\n{dump(resource)}spec:\n{spec}"


def dashboard_configmaps(
    dashboards: Mapping[str, str],
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    sidecar_label: str = SIDECAR_LABEL,
) -> str:
    """One ConfigMap per dashboard (``{file name: JSON text}``), named after the file, with the
    sidecar's label; a multi-document YAML stream."""
    marker = parse_pairs([sidecar_label])
    docs = []
    for filename, text in sorted(dashboards.items()):
        stem = filename.removesuffix(".json")
        docs.append(
            dump(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": _metadata(stem, namespace, {**(labels or {}), **marker}, annotations),
                    "data": {filename: text},
                }
            )
        )
    return "".join(f"---\n{doc}" for doc in docs)


def add_metadata_arguments(parser: argparse.ArgumentParser, default_name: str | None = None) -> None:
    """``--namespace`` and repeatable ``--label KEY=VALUE`` (and ``--name`` when the resource has one name)."""
    if default_name:
        parser.add_argument("--name", default=default_name, help="metadata.name (default: %(default)s)")
    parser.add_argument("--namespace", help="metadata.namespace (default: none, kubectl's current namespace)")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra metadata label, repeatable (kube-prometheus-stack selects PrometheusRules by "
        "release=<helm release name>)",
    )


def add_rules_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``memexporter rules`` options for the PrometheusRule format."""
    parser.add_argument(
        "--format",
        choices=RULE_FORMATS,
        default="rules",
        help="rules: a Prometheus rules file; prometheusrule: a prometheus-operator "
        "PrometheusRule resource (default: %(default)s)",
    )
    add_metadata_arguments(parser, default_name="memexporter")


def rules_output(text: str, args: argparse.Namespace) -> str:
    """The rendered rules in the format ``args`` asks for (``text`` unchanged for ``rules``)."""
    if args.format == "rules":
        if args.namespace or args.label or args.name != "memexporter":
            raise ValueError("memexporter: --name, --namespace and --label apply to --format prometheusrule")
        return text
    return prometheus_rule(text, args.name, args.namespace, parse_pairs(args.label))
