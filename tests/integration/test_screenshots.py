"""The pictures in the README and the docs are taken by this test, not by hand: two demo ranks, one
leaking toward a budget; the live page of the leaking rank in Debian's chromium
(``docs/live-page.png``) and ``memexporter top --svg`` over both (``docs/top.svg``).

Each run checks the pictures it takes (in a temporary folder). ``MEMEXPORTER_UPDATE_SCREENSHOTS=1``
writes them into ``docs/`` instead, to commit, as ``MEMEXPORTER_UPDATE_GOLDEN=1`` does for the
golden exposition."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT
from tests.support.browser import card, console_errors, headless_chromium, text_of, wait_for
from tests.support.demo import module_env, running_demo
from tests.support.ports import free_port
from tests.support.web import get_text

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=35)]

UPDATE = os.environ.get("MEMEXPORTER_UPDATE_SCREENSHOTS") == "1"
MODEL = ("--layers", "2", "--d-model", "128", "--seq-len", "64", "--batch-size", "8", "--step-interval", "0.1")
# The window and warm-up made short, so the leak is named within seconds, not minutes.
QUICK = {"MEMEXPORTER_LEAK_WINDOW": "24", "MEMEXPORTER_WARMUP_STEPS": "5"}
HISTORY_S = 12  # seconds of chart before the picture (a point every 2 s)


def live(port: int) -> dict[str, Any]:
    return json.loads(get_text(f"http://127.0.0.1:{port}/live.json", 5))  # type: ignore[no-any-return]


def cpu(doc: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in doc["devices"] if d["device"] == "cpu")


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_live_page_and_top_pictures_are_taken_from_two_demo_ranks(tmp_path: Path) -> None:
    out = REPO_ROOT / "docs" if UPDATE else tmp_path
    healthy, leaking = free_port(), free_port()
    with ExitStack() as stack:
        stack.enter_context(running_demo(healthy, *MODEL, env={**QUICK, "RANK": "0"}, log=tmp_path / "r0.log"))
        stack.enter_context(
            running_demo(
                leaking,
                *MODEL,
                "--leak-mib-per-step",
                "1",
                "--memory-limit-mib",
                "2048",
                env={**QUICK, "RANK": "1"},
                log=tmp_path / "r1.log",
            )
        )
        wait_for(
            lambda: (
                ((now := cpu(live(leaking))).get("oom_eta_seconds") or 0) > 0 and len(now["history"]) >= HISTORY_S / 2
            ),
            timeout=120,
            what="the leaking rank's ETA and history",
        )
        with headless_chromium(width=1100, height=1000) as browser:
            browser.get(f"http://127.0.0.1:{leaking}/")
            card(browser, "cpu")
            wait_for(
                lambda: "reaches the limit" in text_of(browser, '.card[data-device="cpu"]'), what="the ETA in words"
            )
            assert console_errors(browser) == []
            browser.save_screenshot(str(out / "live-page.png"))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "memexporter",
                "top",
                f"127.0.0.1:{healthy}",
                f"127.0.0.1:{leaking}",
                "--svg",
                str(out / "top.svg"),
                "--width",
                "110",
            ],
            env=module_env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and f"wrote {out / 'top.svg'}" in done.stdout, done.stdout + done.stderr

    width, height = png_size(out / "live-page.png")
    assert width >= 1000 and height >= 800, (width, height)  # the window asked for, not an empty capture
    svg = (out / "top.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg")
    text = " ".join(" ".join(html.unescape(t).split()) for t in re.findall(r">([^<>]*)</text>", svg))
    # The leaking rank (rank 1, with an ETA) is the first row, the healthy one's ETA reads none.
    assert re.search(r"rank 1 │ cpu │ \|#*\s*\| +\d+% of 2\.0 GiB .*rank 0 │ cpu │ .* │ none", text), text
    assert "modules of rank 1" in text and "blocks.0.self_attn" in text, text
