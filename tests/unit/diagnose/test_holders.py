"""Holder names from real referrer walks: each case builds the structure a user's code would."""

from __future__ import annotations

import collections
from typing import Any, ClassVar

import torch
from torch import nn

from memexporter.diagnose.holders import find_holders


class Runner:
    def __init__(self) -> None:
        self.recent_batches: list[torch.Tensor] = []
        self.history: dict[str, list[torch.Tensor]] = {"train": []}
        self.cache: dict[tuple[int, int], torch.Tensor] = {}
        self.last: torch.Tensor | None = None


class Slotted:
    __slots__ = ("window",)

    def __init__(self) -> None:
        self.window: collections.deque[torch.Tensor] = collections.deque()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("running", torch.zeros(3))
        self.leak_store: list[torch.Tensor] = []


CLASS_LEVEL: list[torch.Tensor] = []


class Registry:
    seen: ClassVar[list[torch.Tensor]] = []


def holder(t: torch.Tensor) -> list[str]:
    (names,) = find_holders([t])
    return names


def test_attribute_list() -> None:
    r = Runner()
    r.recent_batches.append(torch.ones(2))
    assert holder(r.recent_batches[0]) == ["Runner.recent_batches (list)"]


def test_nested_dict_keeps_the_string_keys() -> None:
    r = Runner()
    r.history["train"].append(torch.ones(2))
    assert holder(r.history["train"][0]) == ["Runner.history['train'] (list)"]


def test_a_key_that_is_data_is_redacted_to_its_length() -> None:
    # The names reach the job's log and the dumps: an API key used as a cache key must not.
    r = Runner()
    for key in ("sk-proj-Zq81hTfA0pLm4", "hf_token", "x7Hq2LmP9tRz4WbN6yKc"):
        r.history[key] = [torch.ones(2)]
        assert holder(r.history[key][0]) == [f"Runner.history['<redacted {len(key)} chars>'] (list)"]
    setattr(r, "sk-live-0123", [torch.ones(2)])
    assert holder(getattr(r, "sk-live-0123")[0]) == ["Runner.<redacted 12 chars> (list)"]


def test_a_cache_keyed_by_batch_is_named_by_its_attribute() -> None:
    r = Runner()
    r.cache[(7, 11)] = torch.ones(2)
    assert holder(r.cache[(7, 11)]) == ["Runner.cache (dict)"]


def test_a_tensor_held_directly_and_a_tuple_in_a_list() -> None:
    r = Runner()
    r.last = torch.ones(2)
    assert holder(r.last) == ["Runner.last (Tensor)"]
    r.recent_batches.append((torch.ones(1), torch.ones(2)))  # type: ignore[arg-type]
    assert holder(r.recent_batches[0][1]) == ["Runner.recent_batches[*] (tuple)"]


def test_slots_and_deques() -> None:
    s = Slotted()
    s.window.append(torch.ones(2))
    assert holder(s.window[0]) == ["Slotted.window (deque)"]


def test_module_attributes_buffers_and_parameters() -> None:
    net = Net()
    net.leak_store.append(torch.ones(2))
    assert holder(net.leak_store[0]) == ["Net.leak_store (list)"]
    assert holder(net.running) == ["Net.running (Tensor)"]
    assert holder(net.lin.weight) == ["Linear.weight (Parameter)"]


def test_module_global_and_class_attribute() -> None:
    CLASS_LEVEL.append(torch.ones(2))
    Registry.seen.append(torch.ones(2))
    try:
        assert holder(CLASS_LEVEL[0]) == [f"{__name__}.CLASS_LEVEL (list)"]
        assert holder(Registry.seen[0]) == ["Registry.seen (list)"]
    finally:
        CLASS_LEVEL.clear()
        Registry.seen.clear()


def test_closure() -> None:
    def make() -> Any:
        kept = [torch.ones(2)]

        def step() -> list[torch.Tensor]:
            return kept

        return step

    step = make()
    assert holder(step()[0]) == ["step() closure kept (list)"]


def test_a_local_of_the_running_training_loop_is_found_on_the_stack() -> None:
    def training_loop() -> list[str]:
        kept = []
        for _ in range(3):
            kept.append(torch.ones(2))
        return holder(kept[-1])

    assert training_loop() == ["training_loop() local kept (list)"]


def test_a_traceback_keeps_a_finished_frame_and_its_locals() -> None:
    r = Runner()

    def failing_step() -> None:
        activations = torch.ones(5)
        raise ValueError(activations.shape)

    try:
        failing_step()
    except ValueError as exc:
        r.last_error = exc  # type: ignore[attr-defined]  # the classic: an exception kept with its traceback
    frame = r.last_error.__traceback__.tb_next.tb_frame  # type: ignore[attr-defined]
    assert holder(frame.f_locals["activations"]) == ["failing_step() local activations (Tensor)"]


def test_several_samples_in_one_walk_keep_their_own_paths() -> None:
    r = Runner()
    r.recent_batches.append(torch.ones(1))
    r.history["train"].append(torch.ones(2))
    r.cache[(1, 2)] = torch.ones(3)
    names = find_holders([r.recent_batches[0], r.history["train"][0], r.cache[(1, 2)]])
    assert names == [["Runner.recent_batches (list)"], ["Runner.history['train'] (list)"], ["Runner.cache (dict)"]]


def test_the_callers_own_containers_are_ignored() -> None:
    samples = {"group": [torch.ones(2)]}
    assert find_holders(samples["group"], ignore=[samples]) == [[]]
