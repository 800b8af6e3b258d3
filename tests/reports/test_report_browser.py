"""The HTML report in headless Chromium: it renders, the four plots are drawn at a real size,
and every headline number on the page equals the JSON report. Saves a full-page screenshot
(tmp dir, and $TASKPLANE_TEST_ARTIFACTS if set).

Needs Debian's chromium and chromium-driver (.ci/run installs them) and selenium.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
from pathlib import Path

import pytest
from _report_scenario import SINCE, UNTIL, fleet

from taskplane.reports.command import ReportOptions, run_report
from taskplane.reports.render import count, pct, usd
from taskplane.store.writer import CostWriter

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="headless Chromium absent: apt-get install -y chromium chromium-driver (.ci/run does)",
    ),
]

PLOTS = ("plot-cost-over-time", "plot-by-agent-tenant", "plot-waste", "plot-cache-hit")


def _driver():  # type: ignore[no-untyped-def]
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[dev])")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


async def test_html_report_in_headless_chromium(fresh_db_url: str, tmp_path: Path) -> None:
    attempts, tasks = fleet()
    async with CostWriter(fresh_db_url, tmp_path / "outbox") as writer:
        await asyncio.gather(*(writer.record_attempt(a) for a in attempts))
        for t in tasks:
            await writer.upsert_task(t)
        assert await writer.flush(timeout=60)
    common = {"since": SINCE.isoformat(), "until": UNTIL.isoformat(), "group_by": "agent", "tenant": None,
              "database_url": fresh_db_url, "state_dir": tmp_path}
    page, data = tmp_path / "report.html", tmp_path / "report.json"
    await asyncio.to_thread(run_report, ReportOptions(fmt="html", out=page, **common))  # type: ignore[arg-type]
    await asyncio.to_thread(run_report, ReportOptions(fmt="json", out=data, **common))  # type: ignore[arg-type]
    report = json.loads(data.read_text())
    await asyncio.to_thread(_check_in_browser, page, report, tmp_path / "report.png")


def _check_in_browser(page: Path, report: dict[str, object], screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = _driver()
    try:
        driver.get(page.resolve().as_uri())
        assert driver.title == "taskplane cost report"
        assert driver.execute_script("return document.readyState") == "complete"

        for plot in PLOTS:
            svg = driver.find_element(By.CSS_SELECTOR, f"#{plot} svg")
            size = svg.size
            assert svg.is_displayed() and size["width"] > 300 and size["height"] > 120, (plot, size)
            drawn = driver.execute_script(
                "return arguments[0].querySelectorAll('path, rect, line, text, use').length", svg
            )
            assert drawn > 10, plot

        def shown(elem_id: str) -> tuple[str, str]:
            el = driver.find_element(By.ID, elem_id)
            assert el.is_displayed(), elem_id
            return el.text.strip(), el.get_attribute("data-value") or ""

        text, value = shown("cost-per-successful-task")
        assert float(value) == report["cost_per_successful_task_usd"]
        assert text == usd(report["cost_per_successful_task_usd"])  # type: ignore[arg-type]
        text, value = shown("total-cost")
        assert float(value) == report["total_cost_usd"] and text == usd(report["total_cost_usd"])  # type: ignore[arg-type]
        text, value = shown("tasks-succeeded")
        assert int(value) == report["tasks_succeeded"] and text == count(report["tasks_succeeded"])  # type: ignore[arg-type]
        text, value = shown("tasks-failed")
        assert int(value) == report["tasks_failed"] and text == count(report["tasks_failed"])  # type: ignore[arg-type]
        text, _ = shown("cache-hit-ratio")
        assert text == pct(report["cache_hit_ratio"])  # type: ignore[arg-type]
        waste = report["waste"]
        assert isinstance(waste, dict)
        _, value = shown("waste-total")
        assert float(value) == waste["total_usd"]

        embedded = json.loads(driver.find_element(By.ID, "report-json").get_attribute("textContent") or "{}")
        assert embedded["cost_per_successful_task_usd"] == report["cost_per_successful_task_usd"]

        height = driver.execute_script("return document.documentElement.scrollHeight")
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True,
             "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}},
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    finally:
        driver.quit()
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    artifacts = os.environ.get("TASKPLANE_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(artifacts) / "report.png")
    print(f"screenshot: {screenshot}")
