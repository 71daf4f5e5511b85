"""DeepSpeed training scripts, one per way in, for tests/integration/frameworks/test_deepspeed_ways_in.py.

    python deepspeed_script.py WAY OUT_DIR          (one rank: RANK, WORLD_SIZE, MASTER_* in the environment)

- ``plain``: ``deepspeed.initialize`` (ZeRO-3) and a training loop with nothing of memexporter in it,
  for ``memexporter run``, which must find the engine's model by itself;
- ``hf``: the HF ``Trainer`` with a DeepSpeed config (ZeRO-3) and ``MemexporterCallback``;
- ``accelerate``: accelerate's ``DeepSpeedPlugin`` (ZeRO-2, optimizer offloaded to the host) and
  ``memexporter.track(model, optimizer)`` on what ``prepare()`` returns.

Each trains a few optimizer steps with gradient accumulation and two parameter groups, then reads
``/metrics`` over HTTP (``METRICS_URL``, or the exporter it started) and writes ``OUT_DIR/<way>.json``:
the text, the engine's ``global_steps`` and the truth read from DeepSpeed's partitions with torch's
API (tests/support/zero_truth.py).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import deepspeed
import deepspeed.ops
import torch

from tests.support.zero_truth import Net, Truth, config, groups

# DeepSpeed's CPU accelerator builds a shared-memory all-reduce (C++, minutes on 2 cores) unless the
# op is marked not compatible; gloo does the same all-reduce. The one line a CPU run needs, not memexporter's.
deepspeed.ops.__compatible_ops__ = {}

STEPS, ACCUMULATE, BATCH, SEQ, VOCAB = 4, 2, 4, 16, 128


def batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(BATCH, 16, generator=g) for _ in range(n)]


def plain(truth: Truth, url: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=groups(model), config=config(3, False, ACCUMULATE, BATCH)
    )
    for x in batches(STEPS * ACCUMULATE):
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    return {**read(url), "global_steps": engine.global_steps, "truth": truth.held(model, 3)}


def hf(truth: Truth, url: str) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from memexporter.integrations.transformers import MemexporterCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
        ids = torch.randint(0, VOCAB, (STEPS * ACCUMULATE * BATCH, SEQ), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    ds = config(3, False, ACCUMULATE, BATCH)
    ds.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto", train_batch_size="auto")
    ds["optimizer"]["params"].update(lr="auto", weight_decay="auto")
    args = TrainingArguments(
        output_dir=str(Path(sys.argv[2]) / "trainer"),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        max_steps=STEPS,
        weight_decay=0.01,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        deepspeed=ds,
        seed=0,
    )
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)

    class LastStep(TrainerCallback):  # type: ignore[misc]
        """Reads /metrics at the last step's end: at the end of training, the callback untracks the model."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == STEPS:
                result.update(read(url), global_steps=state.global_step, truth=truth.held(model, 3))

    result: dict[str, Any] = {}
    callbacks = [MemexporterCallback(), LastStep()]
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks).train()
    return result


def accelerate(truth: Truth, url: str) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    import memexporter

    ds = config(2, True, ACCUMULATE, BATCH)
    del ds["optimizer"]  # the script's own torch optimizer, which accelerate hands to DeepSpeed
    plugin = DeepSpeedPlugin(hf_ds_config=ds)
    acc = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=ACCUMULATE)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(groups(model), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.cat(batches(STEPS * ACCUMULATE)))
    engine, popt, loader = acc.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=BATCH))
    memexporter.track(engine, popt)
    for (x,) in loader:
        with acc.accumulate(engine):
            acc.backward(engine(x).pow(2).mean())
            popt.step()
            popt.zero_grad()
    return {**read(url), "global_steps": engine.global_steps, "truth": truth.held(model, 2)}


def read(url: str) -> dict[str, str]:
    """``/metrics`` as exported now (a snapshot published first: they are a second apart otherwise)."""
    import memexporter.exporter

    running = memexporter.exporter.running()
    if running is not None:
        running.flush()
    with urllib.request.urlopen(url, timeout=10) as resp:
        return {"metrics": resp.read().decode()}


def main() -> None:
    way, out = sys.argv[1], Path(sys.argv[2])
    truth = Truth()
    url = os.environ.get("METRICS_URL")
    if url is None:  # not under `memexporter run`: the script's own exporter, which the callback adopts
        import memexporter

        url = str(memexporter.start(port=0, addr="127.0.0.1").url)
    result = {"plain": plain, "hf": hf, "accelerate": accelerate}[way](truth, url)
    (out / f"{way}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
