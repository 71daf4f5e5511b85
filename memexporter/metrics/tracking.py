"""The rows of what the training thread records: phases (collectors/phases.py) and the per-module
breakdown (collectors/modules.py). ``SPECS`` has the phases after the OOM view and the modules after
the host (memexporter/metrics/__init__.py).
"""

from __future__ import annotations

from memexporter.metrics.spec import DEVICE_PHASE, MODULE, MODULE_DEVICE, PHASE, RANK, MetricSpec, _c, _g

PHASE_SPECS: tuple[MetricSpec, ...] = (
    # --- Phases (collectors/phases.py): memexporter.phase() and the automatic forward/backward/optimizer.
    _g(
        "phase_peak_bytes",
        unit="bytes",
        help="Highest used during the last completed occurrence of the phase: the lifetime high-water mark when it rose during the phase (exact; cuda: allocated_bytes.all.peak, cpu: the process's own RSS high-water mark, VmHWM), otherwise the highest sample taken at its boundaries and inside it (a lower bound). Peak stats are never reset.",
        labels=DEVICE_PHASE,
        collector="phases",
        otel="memexporter.phase.peak",
    ),
    _g(
        "phase_duration_seconds",
        unit="seconds",
        help="Wall time of the last completed occurrence of the phase.",
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.duration",
    ),
    _c(
        "phase_completed",
        help='Completed occurrences of the phase (distinct phase names beyond the first 16 count as phase="other", but eval, validation, test, predict and checkpoint keep theirs).',
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.completed",
        counts="{occurrence}",
    ),
    _g(
        "phase_active",
        unit="",
        help="1 while the phase is open (nested phases: each open one), else 0.",
        labels=PHASE,
        collector="phases",
        otel="memexporter.phase.active",
    ),
    _g(
        "phase_last_change_timestamp_seconds",
        unit="seconds",
        help="Unix time a phase last began or ended; absent before the first phase.",
        labels=RANK,
        collector="phases",
        otel="memexporter.phase.last_change_timestamp",
        detail=True,
    ),
)


MODULE_SPECS: tuple[MetricSpec, ...] = (
    # --- Per-module breakdown (collectors/modules.py), from snapshots published by the training thread.
    _g(
        "module_parameter_bytes",
        unit="bytes",
        help="Bytes of parameters owned by the module, as this rank holds them (a DTensor's local shard; a tied weight once, in its first owner's row; a view into a shared buffer, its own bytes).",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.parameter",
        detail=True,
    ),
    _g(
        "module_gradient_bytes",
        unit="bytes",
        help="Bytes of .grad tensors of the module's parameters, counted on the training thread at an optimizer step (the first, then at most once a second).",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.gradient",
        detail=True,
    ),
    _g(
        "module_optimizer_state_bytes",
        unit="bytes",
        help="Bytes of optimizer state (e.g. AdamW exp_avg, exp_avg_sq) mapped to the module's parameters, counted like the gradients.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.optimizer_state",
        detail=True,
    ),
    _g(
        "module_parameter_unsharded_bytes",
        unit="bytes",
        help="Bytes of the module's parameters unsharded (their global size), only for a model with sharded (DTensor: FSDP2, tensor parallel; DeepSpeed ZeRO-3: ds_numel) parameters: module_parameter_bytes / this = the share this rank holds. Under FSDP2 and ZeRO-3 also what the all-gather materialises for the module's forward and backward.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.parameter_unsharded",
        sharded=True,
        detail=True,
    ),
    _g(
        "module_device_bytes",
        unit="bytes",
        help="A DeepSpeed ZeRO model's module rows split by the device that holds the bytes (family: parameter, gradient, optimizer_state; CPU offload puts them on device cpu): summed over device, the module_<family>_bytes row. Only for DeepSpeed ZeRO models, read from DeepSpeed's flat partitions and ZeRO-3's ds_tensor.",
        labels=MODULE_DEVICE,
        collector="modules",
        otel="memexporter.module.device",
        sharded=True,
        detail=True,
    ),
    _g(
        "module_activation_bytes",
        unit="bytes",
        help="Bytes saved for backward during the last recorded grad-enabled pass (saved_tensors_hooks; at most one pass a second, and one in eight, is recorded), attributed to the innermost running module; each storage once, parameters (also FSDP's unsharded ones) excluded.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.activation",
        detail=True,
    ),
    _g(
        "module_forward_delta_bytes",
        unit="bytes",
        help="torch.cuda allocated bytes after minus before the module's forward, summed over its calls in the last forward (opt-in: track(cuda_forward_delta=True)). A parent includes its children: not a partition.",
        labels=MODULE,
        collector="modules",
        otel="memexporter.module.forward_delta",
        cuda=True,
        detail=True,
    ),
)
