"""Device memory and identity from the driver library (NVML, amdsmi, torch.xpu), matched to torch's
ordinals by UUID.

NVML and amdsmi ignore ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``, so ``cuda:0`` inside the
process may be physical GPU 3: the UUID from ``get_device_properties`` is the join key. No driver
library (or no match) means no series.
``device_used_bytes`` is NVML's v2 figure, without the driver's reservation, which is
``device_reserved_bytes`` (absent where the driver cannot tell it apart: NVML v1, amdsmi, XPU).
``device_process_used_bytes`` is this process's own share as the driver counts it, and
``device_non_allocator_bytes`` the part of it PyTorch's caching allocator does not hold.
``device_info`` carries what a join with dcgm-exporter needs (NVML's UUID, the physical GPU's
UUID and MIG GPU instance id, the PCI bus id, the model name) and the vendor: see docs/gpus.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.allocator import KEYS
from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families

RESERVED = KEYS["memexporter_allocator_reserved_bytes"]  # the memory_stats() key


class DeviceCollector:
    """``memexporter_device_*`` per device from its driver library (NVML, amdsmi, torch.xpu: ``Scrape.driver``):
    total, used, free and reserved bytes, this process's bytes, the bytes outside the caching allocator, and
    ``device_info``."""

    name = "device"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        total, used, free, reserved, info, process, outside = [], [], [], [], [], [], []
        for index, mem in scrape.driver.items():
            if mem is None:
                continue
            labels = (rank, scrape.label(index))
            total.append((labels, float(mem.total)))
            used.append((labels, float(mem.used)))
            free.append((labels, float(mem.free)))
            if mem.reserved is not None:
                reserved.append((labels, float(mem.reserved)))
            identity = (mem.uuid, mem.name, mem.pci_bus_id, mem.gpu_uuid or mem.uuid, mem.gpu_instance_id, mem.vendor)
            info.append(((*labels, *identity), 1.0))
            mine = scrape.driver_process.get(index)
            if mine is None or mine.why == "error":  # the driver gave no answer at all: no series
                continue
            # NaN, not absent, when the driver lists the device but cannot say for this process:
            # the series says it was asked, and the log says why (the driver's backend).
            process.append((labels, math.nan if mine.used is None else float(mine.used)))
            cached = scrape.allocator_stats.get(index, {}).get(RESERVED)
            if mine.used is not None and cached is not None:
                # The driver's figure and the allocator's are read microseconds apart: a
                # segment freed in between could make the difference negative.
                outside.append((labels, float(max(0, mine.used - cached))))
        return families(
            {
                "memexporter_device_total_bytes": total,
                "memexporter_device_used_bytes": used,
                "memexporter_device_free_bytes": free,
                "memexporter_device_reserved_bytes": reserved,
                "memexporter_device_process_used_bytes": process,
                "memexporter_device_non_allocator_bytes": outside,
                "memexporter_device_info": info,
            }
        )
