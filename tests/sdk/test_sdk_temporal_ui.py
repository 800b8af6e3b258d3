"""The Temporal UI, in a real headless Chromium: an operator finds a finished task by its
taskplane search attributes and sees its steps; the test saves screenshots."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio
import tp_sdk_agents as agents
from tp_sdk_recorder import Recorder

import taskplane
from taskplane.ports import free_port
from taskplane.sdk.client import taskplane_client
from taskplane.temporal_names import SEARCH_ATTRIBUTES, temporal_binary
from workflows.worker import build_worker

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest_asyncio.fixture(scope="module")
async def ui_env() -> AsyncIterator[tuple[Any, str]]:
    """A dev server with its Web UI on (the shared one runs without)."""
    from temporalio.testing import WorkflowEnvironment

    ui_port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        port=free_port(), ui=True, ui_port=ui_port,
    )
    try:
        yield env, f"http://127.0.0.1:{ui_port}"
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium is not installed (Debian packages chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1600,1000", "--no-proxy-server"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for_text(driver: Any, text: str, timeout: float = 60, reload_every: float = 3) -> str:
    """Wait for ``text`` on the page, reloading a rendered page that lacks it (the list is
    eventually consistent). A blank page is still loading the UI's scripts: reloading it
    would start that over, which on a busy machine can take longer than the interval, so
    it is left to finish, and each reload waits twice as long as the one before."""
    end = time.monotonic() + timeout
    last_reload = time.monotonic()
    while time.monotonic() < end:
        body = driver.find_element("tag name", "body").text
        if text in body:
            return str(body)
        if body.strip() and time.monotonic() - last_reload > reload_every:
            driver.refresh()
            last_reload = time.monotonic()
            reload_every *= 2
        time.sleep(0.3)
    raise AssertionError(f"{text!r} did not appear; page shows: {driver.find_element('tag name', 'body').text[:800]}")


async def test_operator_finds_a_finished_task_by_search_attribute(
    ui_env: tuple[Any, str], browser: Any, recorder: Recorder, tmp_path: Path
) -> None:
    env, ui_url = ui_env
    client = taskplane_client(env.client)
    tenant = f"ui-{uuid.uuid4().hex[:6]}"
    queue = f"sdk-ui-{uuid.uuid4().hex[:6]}"
    worker = await build_worker(client, recorder.url, None, ["tp_sdk_agents"], task_queue=queue, include_examples=False)
    async with worker:
        handle = await taskplane.submit(agents.context_agent, "what does the UI show?", client=client,
                                        task_queue=queue, tenant=tenant, deadline=60)
        await handle.result()
        other = await taskplane.submit(agents.simple, 1, client=client, task_queue=queue, tenant="someone-else")
        await other.result()

    await asyncio.to_thread(_operator_session, browser, ui_url, tenant, handle.task_id, other.task_id, tmp_path)


def _operator_session(browser: Any, ui_url: str, tenant: str, task_id: str, other_id: str, tmp_path: Path) -> None:
    """What an operator does in the UI (blocking: runs in a thread)."""
    shots = Path(os.environ.get("TASKPLANE_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    # The filter an operator types: this tenant's finished tasks that cost something.
    query = f"TaskplaneTenant = '{tenant}' AND TaskplaneStatus = 'succeeded' AND TaskplaneCostUsd > 0"
    browser.get(f"{ui_url}/namespaces/default/workflows?query={quote(query)}")
    page = _wait_for_text(browser, task_id)
    assert other_id not in page  # the filter really filtered
    list_shot = shots / "temporal-ui-task-list.png"
    assert browser.save_screenshot(str(list_shot)) and list_shot.stat().st_size > 10_000

    # The task's page: the agent name as the workflow type, the activity summaries, the memo.
    browser.get(f"{ui_url}/namespaces/default/workflows/{quote(task_id)}")
    page = _wait_for_text(browser, "tp_context")
    _wait_for_text(browser, "LLM step 0")
    detail_shot = shots / "temporal-ui-task-detail.png"
    assert browser.save_screenshot(str(detail_shot)) and detail_shot.stat().st_size > 10_000
    print(f"screenshots: {list_shot} {detail_shot}")
