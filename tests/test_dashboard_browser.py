"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright) against the live
stack: it loads, its numbers and charts update as iterations end, and its Pause button pauses the run.

The test saves a screenshot; with FAST_SCREENSHOT_DIR set it also writes dashboard.png there (the
README shows docs/images/dashboard.png, made this way). Without chromium the test is skipped, unless
FAST_REQUIRE_BROWSER=1 (CI sets it: `python3 dev.py test` installs chromium when it can).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from live_stack import live_stack

pytestmark = pytest.mark.slow

BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
if BROWSER is None and os.environ.get("FAST_REQUIRE_BROWSER") != "1":
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)


def test_dashboard_updates_and_pauses_the_run(tmp_path: Path) -> None:
    assert BROWSER is not None, "FAST_REQUIRE_BROWSER=1 but no chromium on PATH"
    from playwright.sync_api import expect, sync_playwright

    with live_stack(tmp_path / "run", samples_per_iteration=128) as stack, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=BROWSER,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.goto(f"{stack.url}/#token={stack.token}")
            # The token leaves the address bar at once (it stays in this tab's sessionStorage).
            assert page.evaluate("location.hash") == ""
            expect(page.locator("#state")).to_have_text("running", timeout=60_000)
            page.wait_for_function("Number(document.getElementById('iteration').textContent) >= 2", timeout=60_000)
            first = int(page.locator("#iteration").text_content())
            page.wait_for_function(
                f"Number(document.getElementById('iteration').textContent) > {first}", timeout=60_000
            )
            # The charts got points from the event stream (or the history), and the table its simulator.
            page.wait_for_function("series.throughput.length >= 2 && series.eta.length >= 2", timeout=60_000)
            expect(page.locator("#simulators tbody tr")).to_have_count(1)
            assert page.locator("#throughput").text_content() not in ("", "-")
            expect(page.locator("#settings")).to_contain_text("in force: mode fast, alpha 0.5")  # "(auto)" if auto

            page.click("#pause")
            expect(page.locator("#state")).to_have_text("paused", timeout=60_000)
            assert stack.status()["state"] == "paused"
            page.wait_for_timeout(500)
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            if os.environ.get("FAST_SCREENSHOT_DIR"):
                target = Path(os.environ["FAST_SCREENSHOT_DIR"]) / "dashboard.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tmp_path / "dashboard.png", target)

            # Without the token the buttons are refused, and the page says so.
            page.fill("#token", "not-the-token")
            page.click("#resume")
            expect(page.locator("#answer")).to_contain_text("refused (403)", timeout=30_000)
            assert stack.status()["state"] == "paused"
            assert problems == [], problems
        finally:
            browser.close()
