"""The headless browser of the live-page tests (tests/support/browser.py) leaves nothing behind:
chromium put a profile lock folder (``org.chromium.Chromium.*``) in ``$TMPDIR`` at each start and
left it at quit, so each run of the test command added a few to /tmp."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.browser import headless_chromium

pytestmark = pytest.mark.integration


def test_a_browser_session_leaves_nothing_in_tmpdir(monkeypatch: pytest.MonkeyPatch) -> None:
    # A short TMPDIR of the test's own: chromium's lock socket must fit a socket path's 108 bytes,
    # which a folder under pytest's tmp_path does not.
    scratch = Path(tempfile.mkdtemp(prefix="mx-"))
    try:
        monkeypatch.setenv("TMPDIR", str(scratch))
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # tempfile reads TMPDIR once
        with headless_chromium() as driver:
            driver.get("data:text/html,<p>memexporter</p>")
            assert driver.find_element("css selector", "p").text == "memexporter"
            assert list(scratch.iterdir()), "the browser's own folder is under TMPDIR while it runs"
        assert list(scratch.iterdir()) == [], "left in TMPDIR after the browser quit"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
