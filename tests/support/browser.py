"""Headless Chromium (Debian's chromium and chromedriver) driving the admin against a live server: the browser fixture, a page's helpers, screenshots under test-output/."""

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.admin import PASSWORD

ROOT = Path(__file__).resolve().parents[2]


SHOTS = ROOT / "test-output" / "screenshots"


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def screenshots(request: pytest.FixtureRequest) -> Path:
    """The screenshot folder, emptied once per run: numbered by step, an earlier run's would mix
    with this one's (each test names its own with a prefix). In a run spread over processes,
    each empties only what it will write again: the files of its own tests' prefixes are
    replaced as they are taken."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    if not hasattr(request.config, "workerinput"):
        for old in SHOTS.glob("*.png"):
            old.unlink()
    return SHOTS


@pytest.fixture(scope="session")
def chromium(screenshots) -> Iterator[object]:
    """One headless Chromium for the run (per process of a run spread over several): starting
    one costs a second or two of CPU, and every browser test would pay it."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("headless Chromium is not installed (scripts/system_deps.py installs it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--window-size=1400,1000", "--lang=en-US",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium) -> Iterator[object]:
    """The run's Chromium as a new visitor finds it: no cookies or stored data from an earlier
    test, a blank page, the usual window size, no extra tabs."""
    driver = chromium
    yield driver
    for handle in driver.window_handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(driver.window_handles[0])
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": "*", "storageTypes": "all"})
    driver.set_window_size(1400, 1000)


class Page:
    """The few things a test does with the browser, named after what a user does."""

    def __init__(self, driver, base_url: str, prefix: str = "") -> None:
        from selenium.webdriver.common.by import By

        self.driver, self.base, self.by = driver, base_url, By
        self.shots, self.prefix = 0, prefix

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str):
        return self.driver.find_element(self.by.CSS_SELECTOR, css)

    def text(self) -> str:
        from selenium.common.exceptions import WebDriverException

        try:
            return self.find("body").text
        except WebDriverException:
            # The page is being replaced: ask again. (Chromium says so as a stale element, a
            # missing one, or "Node with given id does not belong to the document".)
            return ""

    def type(self, css: str, value: str) -> None:
        element = self.find(css)
        element.clear()
        element.send_keys(value)

    def click(self, css: str) -> None:
        self.find(css).click()

    def log_in(self, username: str, then: str, *, shot: bool = False) -> None:
        """Log in on the admin's login page, which then goes to `then`."""
        self.open(f"/admin/login/?next={then}")
        self.type("#id_username", username)
        self.type("#id_password", PASSWORD)
        if shot:
            self.shot("login")
        self.click("input[type=submit]")

    def choose(self, css: str, text: str) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.find(css)).select_by_visible_text(text)

    def rows(self, css: str) -> list[str]:
        return [row.text for row in self.driver.find_elements(self.by.CSS_SELECTOR, css)]

    def wait_for(self, condition, what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                self.shot(f"timeout-{what.replace(' ', '-')}")
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def wait_for_charts(self) -> None:
        """Until the page's charts are drawn (the console's script says so on <html>)."""
        self.wait_for(
            lambda: (
                self.driver.execute_script("return document.documentElement.dataset.chartsDrawn")
                == "1"
            ),
            "the charts",
        )

    def shot(self, name: str) -> None:
        self.shots += 1
        # Full page: make the window as tall as the page (twice: charts re-lay out on resize).
        for _ in range(2):
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(1400, max(1000, min(int(height) + 140, 4000)))
        self.driver.save_screenshot(str(SHOTS / f"{self.prefix}{self.shots:02d}-{name}.png"))
        self.driver.set_window_size(1400, 1000)
