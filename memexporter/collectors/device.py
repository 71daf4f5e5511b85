"""Device memory and identity from NVML, matched to CUDA ordinals by UUID.

NVML ignores ``CUDA_VISIBLE_DEVICES``, so ``cuda:0`` inside the process may be physical GPU 3:
the UUID from ``get_device_properties`` is the join key. NVML unavailable means no series.
``device_info`` carries what a join with dcgm-exporter needs (NVML's UUID, the physical GPU's
UUID and MIG GPU instance id, the PCI bus id, the model name): see the README.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.metrics import families
from memexporter.scrape import Scrape, cuda_label


class DeviceCollector:
    name = "device"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        total, used, free, info = [], [], [], []
        for index, mem in scrape.nvml.items():
            if mem is None:
                continue
            labels = (rank, cuda_label(index))
            total.append((labels, float(mem.total)))
            used.append((labels, float(mem.used)))
            free.append((labels, float(mem.free)))
            identity = (mem.uuid, mem.name, mem.pci_bus_id, mem.gpu_uuid or mem.uuid, mem.gpu_instance_id)
            info.append(((*labels, *identity), 1.0))
        return families({
            "memexporter_device_total_bytes": total,
            "memexporter_device_used_bytes": used,
            "memexporter_device_free_bytes": free,
            "memexporter_device_info": info,
        })
