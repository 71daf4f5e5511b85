"""Small Lightning and Hugging Face ``Trainer`` runs on CPU for the framework callback tests
(tests/integration/frameworks/test_callbacks*.py): the data, the models, the trainers and their
arguments, and the sizes the tests count with. Each framework is imported when a test asks for it
(``lightning()``, ``transformers()``), which skips the test when it is missing; torch and psutil are
needed on import, as the callback tests always needed them."""

from __future__ import annotations

import mmap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.heap import settle

torch = pytest.importorskip("torch", reason="needs torch")
psutil = pytest.importorskip("psutil", reason="needs psutil")
nn = torch.nn
F = torch.nn.functional

MiB = 1 << 20
MARKS = [
    pytest.mark.integration,
    # lightning 2.6 on torch 2.13: lightning's own pytree helper uses a deprecated torch name. Not ours.
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    # The risk and exception runs train without a validation loader: Lightning says so. Expected.
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
]
"""The ``pytestmark`` of every callback test file."""


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def settled_rss() -> int:
    """The RSS once the garbage of the tests this worker ran before is gone (``tests/support/heap.py``)."""
    settle()
    return rss()


def ones(nbytes: int) -> Any:
    """A float32 tensor of ones, ``nbytes`` long, in pages new to the process: a mapping of its own.
    The tests read the RSS (the CPU's ``used``) to find it: from the C heap, it would reuse the pages
    that earlier tests of the worker freed, still resident, and the RSS would not rise at all
    (``tests/support/heap.worn``)."""
    area = mmap.mmap(-1, nbytes)
    tensor = torch.frombuffer(area, dtype=torch.float32)  # keeps ``area`` alive; unmapped with the tensor
    return tensor.fill_(1.0)


# --- Lightning ----------------------------------------------------------------------------------

D_IN, D_OUT, BATCH = 16, 4, 4
L_TRAIN_ROWS, L_VAL_ROWS = 48, 8  # 12 batches an epoch
L_ACCUM, L_EPOCHS, L_VAL_EVERY, L_SAVE_EVERY = 2, 2, 4, 4  # validate every 4 batches, save every 4 steps


def lightning() -> Any:
    return pytest.importorskip("lightning", reason="needs lightning (pip install -e .[frameworks])")


def l_loader(n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(torch.randn(n, D_IN, generator=g), torch.randn(n, D_OUT, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


def make_module(L: Any, eval_extra: int = 0, leak: int = 0, step_sleep: float = 0.0) -> Any:
    class Regressor(L.LightningModule):  # type: ignore[misc]
        """``eval_extra``: bytes held from a validation loop's first batch to its epoch end;
        ``leak``: bytes kept for good at every training batch; ``step_sleep``: seconds per batch."""

        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(D_IN, 32), nn.GELU(), nn.Linear(32, D_OUT))
            self.extra: Any = None
            self.leaked: list[Any] = []
            self.val_loops = 0

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if leak:
                self.leaked.append(ones(leak))
            if step_sleep:
                time.sleep(step_sleep)
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def on_validation_start(self) -> None:  # after the callbacks' (which open the phase)
            self.val_loops += 1

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0 and eval_extra:
                self.extra = ones(eval_extra)
            x, y = batch
            self.log("val_loss", F.mse_loss(self.net(x), y))

        def on_validation_epoch_end(self) -> None:
            self.extra = None

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    return Regressor()


def l_trainer(L: Any, tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> Any:
    opts: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": L_EPOCHS,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "default_root_dir": str(tmp_path),
    }
    opts.update(kwargs)
    return L.Trainer(callbacks=callbacks, **opts)


# --- Hugging Face ---------------------------------------------------------------------------------

SEQ, VOCAB = 16, 64
HF_TRAIN_ROWS, HF_EVAL_ROWS = 48, 8  # 12 micro-batches an epoch, 6 optimizer steps
HF_ACCUM, HF_EPOCHS, HF_EVAL_EVERY, HF_SAVE_EVERY = 2, 2, 2, 3


def transformers() -> Any:
    return pytest.importorskip("transformers", reason="needs transformers (pip install -e .[frameworks])")


def hf_dataset(n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc,name-defined]
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": ids[i], "labels": ids[i]}

    return Tokens()


def tiny_gpt2(T: Any) -> Any:
    cfg = T.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(cfg)


def hf_args(T: Any, tmp_path: Path, **kwargs: Any) -> Any:
    opts: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": BATCH,
        "per_device_eval_batch_size": BATCH,
        "num_train_epochs": HF_EPOCHS,
        "logging_strategy": "no",
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    opts.update(kwargs)
    return T.TrainingArguments(**opts)
