"""What measuring the step's input costs the training thread (issue 41: at most 1 us a step).

Per step, the tracked model's outermost forward measures its arguments (``inputs.note_call``, from the
entry pre-hook, which now takes the keyword arguments too) and the boundary closes the step's input and
offers each device's peak to the input log (``end_step``, ``measured``). Times each, in thread CPU time
(``time.thread_time``: what another process on a shared machine moves least), as the best of several
repeats, for a plain loop's ``model(x)`` and the HF Trainer's ``model(**batch)``. The pre-hook's keyword
form costs torch nothing to dispatch (``Module._call_impl`` looks every pre-hook up in
``_forward_pre_hooks_with_kwargs`` either way): one more argument to the call, timed here as a bare
call of each form. A launch-bound step is milliseconds
(``bench_launch.py``: 4 to 40 ms on a shared 2-core box), where 1 us is under the noise of any ratio:
hence this count of the added work itself.

    python benchmarks/bench_inputs.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn

from memexporter.tracking import inputs
from memexporter.tracking.inputs import InputLog


def best_us(fn: Callable[[], object], calls: int, repeat: int = 9) -> float:
    """The fastest of ``repeat`` runs of ``calls`` calls, in microseconds of this thread's CPU time."""
    return min(timeit.repeat(fn, number=calls, repeat=repeat, timer=time.thread_time)) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    log = InputLog()
    inputs.activate(log)
    x = torch.randint(0, 64, (2, 8))
    batch = {"input_ids": x, "attention_mask": torch.ones(2, 8), "labels": x}

    def boundary() -> None:
        log.note(16, 8, 2)
        size = log.end_step()
        if size is not None:
            log.measured("cpu", size, 5, 100, 0, False)  # a step whose peak was not measured: no point

    module, no_kwargs = nn.Linear(4, 4), {}

    def pre(m: nn.Module, a: object) -> None:
        return None

    def pre_kwargs(m: nn.Module, a: object, k: object) -> None:
        return None

    without = best_us(lambda: pre(module, (x,)), args.calls)
    with_kwargs = best_us(lambda: pre_kwargs(module, (x,), no_kwargs), args.calls)
    figures = {
        "forward model(x): note_call": best_us(lambda: inputs.note_call((x,), {}), args.calls),
        "forward model(**batch), 3 tensors: note_call": best_us(lambda: inputs.note_call((), batch), args.calls),
        "boundary: end_step + measured (one device)": best_us(boundary, args.calls),
        "a pre-hook with kwargs, over one without": max(with_kwargs - without, 0.0),
        "reference: an empty call": best_us(lambda: None, args.calls),
    }
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; best of 9, thread CPU time"
    )
    for name, us in figures.items():
        print(f"  {name:48s} {us:6.3f} us")
    per_step = sum(v for k, v in figures.items() if k.startswith(("forward model(x)", "boundary", "a pre-hook")))
    print(f"  per step of a plain loop (forward + boundary + hook)   {per_step:6.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
