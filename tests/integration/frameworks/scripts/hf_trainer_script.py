"""An ordinary HF ``Trainer`` script, with nothing of memexporter in it: ``memexporter run`` must find
the model by itself (tests/integration/frameworks/test_run_autotrack.py).

    python hf_trainer_script.py OUT_DIR

Trains a tiny GPT-2 (from a config, tied embeddings) for a few optimizer steps on random tokens,
with gradient accumulation. When ``HF_SCRIPT_METRICS_URL`` is set, reads that URL over plain HTTP
at the end (while the exporter still runs) and writes ``OUT_DIR/result.json``: the ``/metrics``
text, the ``Trainer``'s global step, and the model's parameter bytes and count computed here from
element counts. The test compares the two.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

SEQ, VOCAB = 16, 128


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=32,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(48))
    trainer.train()

    url = os.environ.get("HF_SCRIPT_METRICS_URL")
    if url:
        import memexporter.exporter

        running = memexporter.exporter.running()
        if running is not None:
            running.flush()  # a snapshot after the last step (they are a second apart otherwise)
        with urllib.request.urlopen(url, timeout=10) as resp:
            metrics = resp.read().decode()
        params = list(model.parameters())  # a tied weight once
        result = {
            "metrics": metrics,
            "global_step": trainer.state.global_step,
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "param_count": len(params),
            "module_names": [name for name, _ in model.named_modules()],
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
