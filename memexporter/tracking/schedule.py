"""Which grad-enabled forwards of a tracked model are recorded, pass by pass (pure: no torch).

A recorded forward costs about 25 µs per hooked module (the pack hook runs for every saved
tensor), so a model's forwards are recorded at most once per ``RECORD_INTERVAL_S`` and one pass in
``RECORD_EVERY``; the first is always recorded. The unit is the **pass**: what runs between two
optimizer steps, or between two backwards.

- Entries of one pass (an encoder, then a decoder, each called by the training step) share one
  decision and one count: the figure is the pass's, never the decoder's alone.
- Entering an entry already seen starts a new pass (the next micro-batch under gradient
  accumulation) once a backward ran over the recorded saves; before that, it is the same pass (a
  siamese or chosen/rejected model called twice before one backward holds both calls' saves), at
  most ``MAX_REENTRIES`` times, so a grad-enabled loop with no backward stays bounded.
- A pass while another tracked model records (a teacher inside a student) is recorded too, so
  each save lands in the innermost tracked model's figure, every time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

RECORD_INTERVAL_S = 1.0
"""A pass is recorded at most this often (seconds)..."""
RECORD_EVERY = 8
"""...and at most one pass in this many: a step slower than the interval pays one step in eight."""
MAX_REENTRIES = 16
"""Calls of one entry without a backward that still add up to one pass."""


class Schedule:
    """The pass state of one tracked model. Called on the training thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.rows: set[int] = set()  # entries entered in the current pass
        self.recording = False  # the current pass is recorded
        self.backward = False  # a backward unpacked saves of the current (recorded) pass
        self._reentries = 0
        self._since = 1 << 30  # passes since the last recorded one: the first pass records
        self._at = -1e18  # when the last recorded pass started

    def enter(self, row: int, forced: bool = False) -> tuple[bool, bool]:
        """An outermost grad-enabled forward of entry ``row`` starts: ``(record it, new count)``.

        ``forced``: another tracked model is recording around this one."""
        if self.rows:
            if row not in self.rows:
                self.rows.add(row)
                return self.recording, False
            if self.recording and not self.backward and self._reentries < MAX_REENTRIES:
                self._reentries += 1
                return True, False
        self.rows, self._reentries, self.backward = {row}, 0, False
        self._since += 1
        now = self._clock()
        self.recording = forced or (self._since >= RECORD_EVERY and now - self._at >= RECORD_INTERVAL_S)
        if self.recording:
            self._at, self._since = now, 0
        return self.recording, self.recording

    def step(self) -> None:
        """An optimizer step over the model ended the pass."""
        self.rows = set()
