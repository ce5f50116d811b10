"""The fleet page in a real headless browser (Debian's chromium + chromium-driver, driven by
selenium): it loads, shows both workers of a two-worker cluster, marks one lost when it is
killed, and its chat box streams a reply from the router's own API. The router serves on a
real socket with stand-in workers (tests/conftest.py make_cluster). With a host agent (a fake
one on a real ZeroMQ socket) it shows the host's budget and the catalog, and its Load button
reaches the host as a StartWorker.

FLEET_PAGE_SCREENSHOT=docs/fleet-page.png saves the README's screenshot."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from shared.placement.messages import HostFetch
from tests.conftest import MODEL_ID
from tests.support.fake_worker import FakeHost

pytestmark = pytest.mark.slow
KEY = "mlxf-page-key"
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev extra")
if CHROMIUM is None or DRIVER is None:
    pytest.skip(
        "chromium and chromium-driver are not installed (scripts/setup installs them: "
        "apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
)


@pytest.fixture
def browser():
    profile = tempfile.mkdtemp(prefix="fleet-page-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # without the OpenBLAS LD_PRELOAD the test command sets: chromium's renderer dies with it
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    service = webdriver.ChromeService(DRIVER, env=env)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def health_of(driver) -> dict[str, str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "tr[data-worker]")
    return {
        row.get_attribute("data-worker"): row.find_element(By.CLASS_NAME, "health").text
        for row in rows
    }


def wait_for(driver, condition, timeout: float = 30.0):  # generous: a loaded 2-core CI
    # the page re-renders its tables on every poll: an element found a moment ago may be gone
    wait = WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    )
    return wait.until(lambda d: condition(d))


async def test_fleet_page_shows_workers_follows_a_kill_and_streams_a_chat(make_cluster, browser):
    cluster = await make_cluster(api_keys=(KEY,))
    await cluster.add_worker("worker-a", token_delay_s=0.02)
    await cluster.add_worker("worker-b", token_delay_s=0.02)
    url = str(cluster.client.make_url("/dashboard"))
    run = asyncio.to_thread  # the browser blocks; the router's loop must keep serving

    await run(browser.get, url)
    status = await run(lambda: browser.find_element(By.ID, "status"))
    await run(wait_for, browser, lambda d: "API key" in status.text)  # data calls need the key

    field = await run(lambda: browser.find_element(By.ID, "api-key"))
    await run(field.send_keys, KEY, Keys.ENTER)  # the key form submits on Enter
    both = {"worker-a": "healthy", "worker-b": "healthy"}
    await run(wait_for, browser, lambda d: health_of(d) == both)
    page = (await run(lambda: browser.find_element(By.TAG_NAME, "main").text)).lower()
    assert "tiny" in page and "tokens/s" in page and "blocks" in page

    # the chat box: Enter sends, the reply streams in
    message = await run(lambda: browser.find_element(By.ID, "message"))
    await run(message.send_keys, "Say hello", Keys.ENTER)
    reply = await run(lambda: browser.find_element(By.ID, "reply"))
    await run(wait_for, browser, lambda d: reply.get_attribute("data-state") in ("done", "error"))
    assert reply.get_attribute("data-state") == "done", reply.text
    assert reply.text.strip()
    await run(wait_for, browser, lambda d: "1 (" in d.find_element(By.ID, "models").text)

    if target := os.environ.get("FLEET_PAGE_SCREENSHOT"):
        await run(browser.save_screenshot, str(Path(target)))

    await cluster.kill_worker("worker-b")  # the router declares it lost after 0.4 s of silence
    lost = {"worker-a": "healthy", "worker-b": "lost"}
    await run(wait_for, browser, lambda d: health_of(d) == lost)


def catalog_state(driver, model: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-catalog-model="{model}"]')
    return row.find_element(By.CLASS_NAME, "state").text


def click_action(driver, model: str, action: str) -> bool:
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-catalog-model="{model}"]')
    row.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]').click()
    return True


async def test_fleet_page_shows_a_host_and_loads_a_catalog_model_there(make_cluster, browser):
    # hosts are lost after heartbeat_timeout_s of silence: generous, the browser shares 2 cores
    cluster = await make_cluster(api_keys=(KEY,), heartbeat_timeout_s=5.0)
    host = FakeHost(cluster.zmq_endpoint, "host-a", 8 << 30, (MODEL_ID,))
    task = asyncio.create_task(host.run())
    run = asyncio.to_thread
    try:
        await run(browser.get, str(cluster.client.make_url("/dashboard")))
        field = await run(lambda: browser.find_element(By.ID, "api-key"))
        await run(field.send_keys, KEY, Keys.ENTER)

        hosts = await run(lambda: browser.find_element(By.ID, "hosts"))
        await run(wait_for, browser, lambda d: "host-a" in hosts.text)
        assert "budget 8.00 GiB" in hosts.text and "alive" in hosts.text
        await run(wait_for, browser, lambda d: catalog_state(d, MODEL_ID) == "available")

        await run(wait_for, browser, lambda d: click_action(d, MODEL_ID, "load"))
        await cluster.wait_until(lambda: host.starts(), timeout=10)
        (start,) = host.starts()
        assert start.model == MODEL_ID and start.estimate_bytes > start.kv_memory_bytes > 0
        await run(wait_for, browser, lambda d: catalog_state(d, MODEL_ID).startswith("loading"))
        assert start.worker_id in await run(lambda: catalog_state(browser, MODEL_ID))
        await run(wait_for, browser, lambda d: "starting" in hosts.text)

        # a second load goes over max_workers (1): the router's 409 is shown, not swallowed
        message = await run(lambda: browser.find_element(By.ID, "admin-message"))
        await run(wait_for, browser, lambda d: click_action(d, MODEL_ID, "load"))
        await run(wait_for, browser, lambda d: "409" in message.text)
        assert "max_workers" in message.text and message.get_attribute("data-state") == "error"
        assert len(host.starts()) == 1

        # a Hub model's files on their way: a bar under the host, with its percentage
        host.fetches = (HostFetch(MODEL_ID, 40_000_000, 100_000_000),)
        await run(wait_for, browser, lambda d: "fetching" in hosts.text)
        assert f"fetching {MODEL_ID} from the Hub · 40% (40.0 MB of 100.0 MB)" in hosts.text
        bar = await run(lambda: hosts.find_element(By.CSS_SELECTOR, "[role=progressbar]"))
        assert bar.get_attribute("aria-valuenow") == "40"
        await run(
            wait_for, browser, lambda d: "fetching on host-a: 40%" in catalog_state(d, MODEL_ID)
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        host.close()
