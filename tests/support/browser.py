"""Debian's ``chromium``, headless, driven by Selenium through Debian's ``chromedriver`` (both
installed by ``scripts/setup.sh --test``; Selenium never downloads a driver here)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@contextlib.contextmanager
def headless_chromium(width: int = 1100, height: int = 1400) -> Iterator[Any]:
    """A Selenium driver of a headless chromium window of ``width`` x ``height`` pixels that keeps
    the page's console log; skips (with the reason) where chromium, its driver or selenium is missing."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (scripts/setup.sh --test installs Debian's)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the [dev] extra has it)")
    from selenium.webdriver.chrome.service import Service

    # Chromium keeps its profile and a singleton lock folder (org.chromium.Chromium.*) in $TMPDIR
    # and leaves the lock folder behind at quit: one folder of its own, removed afterwards.
    scratch = tempfile.mkdtemp(prefix="memexporter-chromium-")
    options = webdriver.ChromeOptions()
    options.add_argument(f"--user-data-dir={os.path.join(scratch, 'profile')}")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--ignore-certificate-errors",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch})
    try:
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "the page") -> Any:
    """``predicate()``'s first true value, polled every 0.2 s for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} did not get there in {timeout:.0f} s")


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def text_of(driver: Any, css: str) -> str:
    """The text of the first element matching ``css`` now, found again on each call: the live page
    redraws its cards at each refresh, so an element found earlier can be gone ("" then)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        found = driver.find_elements("css selector", css)
        return str(found[0].text) if found else ""
    except StaleElementReferenceException:
        return ""


def card(driver: Any, device: str) -> Any:
    """The live page's card of ``device``, once it is drawn."""
    return wait_for(lambda: next(iter(driver.find_elements("css selector", f'.card[data-device="{device}"]')), None))
