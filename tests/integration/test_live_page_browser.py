"""The live page in a real browser: Debian's ``chromium``, headless, driven by Selenium
(``tests/support/browser.py``). The page loads without a console error, draws its chart, shows the
figures ``/live.json`` (and so ``/metrics``) has, is where the demo says to look, updates while the
demo trains, and works over TLS."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

import memexporter
from memexporter.collectors import levers
from tests.support.browser import card, console_errors, headless_chromium, wait_for
from tests.support.demo import SMALL_MODEL, running_demo
from tests.support.ports import free_port
from tests.support.web import get_text

pytestmark = pytest.mark.integration

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
MiB = 1 << 20
TINY = (*SMALL_MODEL, "--step-interval", "0.1")


def shown(n: float) -> str:
    """The page's own formatting of a byte count (live.html ``bytes()``): JavaScript's ``toFixed(1)``
    rounds a tie up, where Python's format rounds it to even. RSS comes in 4 KiB pages, so a tie is
    common: 486.25 MiB is 124,480 of them, and the page said 486.3 where ``f"{n:.1f}"`` said 486.2."""
    i = 0
    while abs(n) >= 1024 and i < len(UNITS) - 1:
        n, i = n / 1024, i + 1
    tenths = Decimal(n).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)  # the float's exact value
    return f"{tenths} {UNITS[i]}"


@pytest.fixture
def browser() -> Iterator[Any]:
    with headless_chromium() as driver:
        yield driver


def test_the_page_shows_what_live_json_says_and_draws_its_chart(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levers, "PAGE_INTERVAL_S", 0.0)  # the flushed snapshot's levers, not the first one's
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=2)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    handle = memexporter.track(model, opt)
    for _ in range(8):
        model(torch.randn(8, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert exp.flush()  # the snapshot after the 8th step (one is published each second)
    base = exp.url.removesuffix("/metrics")  # type: ignore[union-attr]
    try:
        browser.get(base + "/")
        cpu = card(browser, "cpu")
        doc = json.loads(get_text(base + "/live.json"))  # the job is paused: same figures
        figures = next(d for d in doc["devices"] if d["device"] == "cpu")
        for key in ("memory_peak_bytes", "memory_baseline_bytes"):
            assert cpu.find_element("css selector", f'[data-figure="{key}"] b').text == shown(figures[key]), key
        assert figures["in_words"] in cpu.text
        assert int(cpu.find_element("css selector", "svg").get_attribute("data-points")) == len(figures["history"]) >= 1
        assert "8 steps" in browser.find_element("id", "status").text
        # The module table lists /live.json's rows in order (other tests' tracked models may share the process).
        names = [
            r.find_element("css selector", "td").text for r in browser.find_elements("css selector", "#modules tr")[1:]
        ]
        assert names == [m["module"] for m in doc["modules"]] and "(root)" in names
        # What would fit: /live.json's top three levers, in its order (issue 44).
        shown_levers = [e.text for e in browser.find_elements("css selector", "#levers [data-lever]")]
        assert shown_levers == [v["text"] for v in doc["levers"]] and any("precision:" in t for t in shown_levers)
        # The formatting compared with, on the page's own function: ties, and what is no tie.
        for n in (486.25 * MiB, 0.05 * MiB, 1023.95 * MiB, 1536, 0, 3 * 1024**3 + 1):
            assert browser.execute_script("return bytes(arguments[0])", n) == shown(n), n
        assert console_errors(browser) == []
        browser.save_screenshot(str(tmp_path / "live-page.png"))
    finally:
        handle.remove()
        exp.stop()


def test_the_demo_prints_the_pages_url_and_the_page_updates_while_it_trains(browser: Any, tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "demo.log"
    with running_demo(port, *TINY, log=log):
        printed = wait_for(lambda: re.search(r"open (http://\S+/) in a browser", log.read_text()))
        browser.get(printed.group(1))  # as a user does: the URL the demo printed
        card(browser, "cpu")
        status = browser.find_element("id", "status")

        def steps() -> int:
            return int(status.text.split(" steps")[0].rsplit(" ", 1)[-1]) if " steps" in status.text else -1

        first = wait_for(lambda: steps() if steps() > 0 else None)
        wait_for(lambda: steps() > first, timeout=15)  # the next refresh (every 5 s) shows more steps
        points = browser.find_element("css selector", '.card[data-device="cpu"] svg').get_attribute("data-points")
        assert int(points) >= 2 and console_errors(browser) == []


def test_the_page_works_over_tls(browser: Any, tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    exp = memexporter.start(port=0, addr="127.0.0.1", certfile=str(cert), keyfile=str(key))
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert exp.flush()
    try:
        assert exp.url is not None and exp.url.startswith("https://")
        browser.get(exp.url.removesuffix("/metrics") + "/")
        card(browser, "cpu")
        assert "3 steps" in browser.find_element("id", "status").text and console_errors(browser) == []
    finally:
        exp.stop()
