"""What a started exporter may write on the job's stderr: the one line that says where it serves
(``serving.job.starting.say_serving``, when the application has not set up logging), and nothing else."""

from __future__ import annotations

import re

SERVING = re.compile(r"memexporter: serving https?://\S+/metrics \(rank \d+\)")


def besides_serving(err: str) -> str:
    """``err`` less exactly one serving line; raises if that line is missing or repeated."""
    lines = err.splitlines()
    said = [line for line in lines if SERVING.fullmatch(line)]
    assert len(said) == 1, f"expected one serving line on stderr, got {len(said)}:\n{err[:2000]}"
    return "\n".join(line for line in lines if line not in said)
