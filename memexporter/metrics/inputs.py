"""The input's rows: the step's input size, and the largest input that fits (collectors/inputs.py).

The training thread measures what each step was given (tracking/inputs.py); the capacity is fitted from
the job's own steps (oom/capacity.py). After the OOM view's rows in ``SPECS``.
"""

from __future__ import annotations

from memexporter.metrics.spec import DEVICE, RANK, MetricSpec, _g

INPUT_SPECS: tuple[MetricSpec, ...] = (
    _g(
        "step_input_elements",
        unit="",
        help="Elements of the last completed step's input: every tensor argument of the tracked model's outermost training forward, one level into tuples, lists and dicts (shapes only), or what memexporter.step_input() reported; the largest of the step's forwards. Absent before a step with an input.",
        labels=RANK,
        collector="inputs",
        otel="memexporter.step.input_elements",
    ),
    _g(
        "step_input_elements_max",
        unit="",
        help="The largest step input seen in the run (elements, as memexporter_step_input_elements).",
        labels=RANK,
        collector="inputs",
        otel="memexporter.step.input_elements_max",
    ),
    _g(
        "step_input_max_length",
        unit="",
        help="Length of the largest step input seen: dimension 1 of its largest tensor with 2 or more dimensions (0: none). The length that fits is input_capacity_elements x this / step_input_elements_max.",
        labels=RANK,
        collector="inputs",
        otel="memexporter.step.input_max_length",
        detail=True,
    ),
    _g(
        "step_input_max_batch",
        unit="",
        help="Batch of the largest step input seen: dimension 0 of its largest tensor with 2 or more dimensions (0: none).",
        labels=RANK,
        collector="inputs",
        otel="memexporter.step.input_max_batch",
        detail=True,
    ),
    _g(
        "input_capacity_elements",
        unit="",
        help="The largest step input (elements), grown with the job's own mix of batch and length, whose predicted committed step peak fits memory_limit_bytes: a robust fit of the measured step peaks above each step's start against the input (constant + elements + elements x length), from the committed bytes now. Absent without spread in the inputs (fewer than 3 sizes, the largest under 1.5x the smallest) or when the peak does not follow the input.",
        labels=DEVICE,
        collector="inputs",
        otel="memexporter.input.capacity_elements",
        needs="step inputs of 3 or more sizes, 1.5x apart or more, whose step peak follows them",
    ),
    _g(
        "input_bytes_per_element",
        unit="",
        help="Marginal bytes of step peak per input element at the largest input seen, from the same fit as input_capacity_elements; absent with it.",
        labels=DEVICE,
        collector="inputs",
        otel="memexporter.input.bytes_per_element",
        detail=True,
        needs="step inputs of 3 or more sizes, 1.5x apart or more, whose step peak follows them",
    ),
    _g(
        "input_declared_max_elements",
        unit="",
        help="The largest step input the data can bring (elements), as declared by max_input_elements (MEMEXPORTER_MAX_INPUT_ELEMENTS); absent when not declared.",
        labels=RANK,
        collector="inputs",
        otel="memexporter.input.declared_max_elements",
        needs="max_input_elements declared",
    ),
)
