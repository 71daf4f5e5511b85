"""The GPU page's PromQL joins (docs/gpus.md) with dcgm-exporter, run by the real promtool on DCGM-shaped series.

The memexporter side comes from real scrapes (the real backends over the SYNTHETIC fixtures'
torch.cuda and NVML answers): three ranks, on two whole A100s and on a MIG slice. The DCGM side
is labelled as dcgm-exporter labels a GPU (``internal/pkg/rendermetrics``: gpu, UUID, pci_bus_id,
device, modelName, GPU_I_PROFILE and GPU_I_ID on MIG, Hostname; DCGM_FI_DRIVER_VERSION from the
default counters), on every GPU of both nodes, the unused ones and the MIG parent included.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.cuda_standins import load
from tests.support.fixture_checks import check_mapping
from tests.support.synthetic_fixtures import SYNTHETIC_DIR

pytestmark = pytest.mark.integration

MiB = 1 << 20
DRIVER = "550.54.15"


def documented_queries() -> list[str]:
    section = (
        (REPO_ROOT / "docs" / "gpus.md").read_text().split("## Joining with dcgm-exporter", 1)[1].split("\n#", 1)[0]
    )
    return re.findall(r"```promql\n(.*?)```", section, re.S)


def series(name: str, labels: dict[str, str]) -> str:
    # Prometheus drops empty label values at ingestion; so does this.
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v) + "}"


def memexporter_side(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Per rank: its device_info labels and reserved bytes, from a real scrape of its fixture."""
    from memexporter.backends.cuda import TorchBackend
    from memexporter.backends.nvml import NvmlBackend
    from tests.support.cuda_standins import TorchStandIn
    from tests.support.fakes import FakeHost, registry_for, sources
    from tests.support.nvml_standin import NvmlStandIn

    a100 = load(SYNTHETIC_DIR / "a100_torch2.13_fraction.json")["answers"]
    other = copy.deepcopy(a100)  # rank 1: the same node's first GPU
    other["devices"]["0"]["properties"]["uuid"] = other["nvml"]["gpus"][0]["uuid"].removeprefix("GPU-")
    mig = load(SYNTHETIC_DIR / "a100_mig_1g.10gb_torch2.13.json")["answers"]
    ranks = []
    for rank, (node, answers) in enumerate([("node-a", a100), ("node-a", other), ("node-b", mig)]):
        with monkeypatch.context() as mp:
            check_mapping(mp, answers)  # the scrape is sound before it is joined
            TorchStandIn(answers).install(mp)
            NvmlStandIn(answers["nvml"]).install(mp)
            reg = registry_for(sources(TorchBackend(), NvmlBackend(), FakeHost()))  # type: ignore[arg-type]
            samples = {s.name: s for f in reg.collect() for s in f.samples}
        target = {"job": "trainer", "instance": f"{node}:{9400 + rank}", "rank": str(rank)}
        info, reserved = samples["memexporter_device_info"], samples["memexporter_allocator_reserved_bytes"]
        ranks.append(
            {
                "target": target,
                "info": {**info.labels, **target},
                "reserved": reserved.value,
                "reserved_labels": {**reserved.labels, **target},
                "nvml": answers["nvml"],
                "node": node,
            }
        )
    return ranks


def dcgm_side(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DCGM_FI_DEV_FB_USED (MiB) for every GPU and MIG instance of both nodes."""
    out, seen = [], set()
    for r in ranks:
        if r["node"] in seen:
            continue
        seen.add(r["node"])
        for i, gpu in enumerate(r["nvml"]["gpus"]):
            base = {
                "gpu": str(i),
                "UUID": gpu["uuid"],
                "pci_bus_id": gpu["pci_bus_id"],
                "device": f"nvidia{i}",
                "modelName": gpu["name"],
                "Hostname": r["node"],
                "DCGM_FI_DRIVER_VERSION": DRIVER,
                "job": "dcgm-exporter",
                "instance": f"{r['node']}:9400",
            }
            out.append({"labels": base, "value": gpu["memory"]["used"] // MiB})
            for mig in gpu["mig"]:
                labels = {**base, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": str(mig["gpu_instance_id"])}
                out.append({"labels": labels, "value": mig["memory"]["used"] // MiB})
    return out


def test_readme_dcgm_joins_on_dcgm_shaped_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queries = documented_queries()
    assert len(queries) == 2, "docs/gpus.md's DCGM section has the two documented joins"
    ranks = memexporter_side(monkeypatch)
    dcgm = dcgm_side(ranks)
    assert [r["info"]["gpu_instance_id"] for r in ranks] == ["", "", "13"]

    def key(labels: dict[str, str]) -> tuple[str, str]:
        return labels["UUID"], labels.get("GPU_I_ID", "")

    by_gpu = {(r["info"]["gpu_uuid"], r["info"]["gpu_instance_id"]): r for r in ranks}
    matched = [d for d in dcgm if key(d["labels"]) in by_gpu]
    assert len(matched) == 3 and len(dcgm) == 4 + 1 + 3  # unused GPUs and the MIG parent stay out
    rank_of = [
        {"labels": {**d["labels"], "rank": by_gpu[key(d["labels"])]["target"]["rank"]}, "value": d["value"]}
        for d in matched
    ]
    outside = [
        {"labels": d["labels"], "value": d["value"] * MiB - by_gpu[key(d["labels"])]["reserved"]} for d in matched
    ]

    values = "{0} {0} {0}"
    inputs = [{"series": series("DCGM_FI_DEV_FB_USED", d["labels"]), "values": values.format(d["value"])} for d in dcgm]
    for r in ranks:
        inputs.append({"series": series("memexporter_device_info", r["info"]), "values": values.format(1)})
        inputs.append(
            {
                "series": series("memexporter_allocator_reserved_bytes", r["reserved_labels"]),
                "values": values.format(int(r["reserved"])),
            }
        )
    tests = [
        {
            "interval": "1m",
            "input_series": inputs,
            "promql_expr_test": [
                {
                    "expr": query,
                    "eval_time": "2m",
                    "exp_samples": [{"labels": series("", s["labels"]), "value": s["value"]} for s in expected],
                }
                for query, expected in zip(queries, [rank_of, outside], strict=True)
            ],
        }
    ]
    path = tmp_path / "dcgm_join.yml"
    path.write_text(yaml.safe_dump({"tests": tests}, sort_keys=False))
    done = subprocess.run(
        [require("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
