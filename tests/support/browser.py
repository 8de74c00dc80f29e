"""A headless Chromium for the console's tests, driven by selenium through Debian's
chromedriver: one browser a test session, downloads into a directory the tests read, and
helpers to wait for the page and to look at a screenshot.

Tests skip, saying why, only when chromium, chromedriver or selenium is not installed
(``make browser`` installs them)."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: the window's size; a screenshot is the viewport, this size at the device pixel ratio
WINDOW = (1280, 900)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        return f"needs {CHROMIUM} and {CHROMEDRIVER}: run `make browser` (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401 - only whether it is there
    except ImportError:
        return "needs selenium: pip install 'headwater[dev]'"
    return None


def start_browser(downloads: Path) -> Any:
    """A headless Chromium whose downloads land in ``downloads``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's headless Chromium (``browser.downloads``: where its downloads land)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    downloads = tmp_path_factory.mktemp("downloads")
    driver = start_browser(downloads)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # noqa: BLE001 - a page between renders: try again until the deadline
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def open_page(driver: Any, url: str) -> None:
    """Go to ``url`` (a console hash route) and wait until its page has rendered."""
    driver.execute_script("document.body && (document.body.dataset.ready = '0')")
    if driver.current_url.split("#")[0] == url.split("#")[0] and "#" in url:
        driver.execute_script("location.hash = arguments[0]", url.split("#", 1)[1])
    else:
        driver.get(url)
    wait_for(f"{url} to render", lambda: driver.execute_script("return document.body.dataset.ready === '1'"))


def wait_rendered(driver: Any) -> None:
    """Wait for the page the last action led to (a form's hash change, a refresh)."""
    wait_for("the page to render", lambda: driver.execute_script("return document.body.dataset.ready === '1'"))


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def distinct_colours(driver: Any, png: bytes) -> int:
    """How many distinct colours the PNG holds, decoded by the browser (the tests have no
    image library): drawn into a canvas, its pixels counted."""
    script = """
    const done = arguments[arguments.length - 1];
    const img = new Image();
    img.onload = () => {
      const c = document.createElement("canvas");
      c.width = img.width; c.height = img.height;
      const g = c.getContext("2d");
      g.drawImage(img, 0, 0);
      const px = new Uint32Array(g.getImageData(0, 0, c.width, c.height).data.buffer);
      done(new Set(px).size);
    };
    img.onerror = () => done(-1);
    img.src = "data:image/png;base64," + arguments[0];
    """
    return int(driver.execute_async_script(script, base64.b64encode(png).decode()))


def screenshot(driver: Any, directory: Path, name: str, colours_min: int = 8) -> Path:
    """Save the viewport as ``name``.png in ``directory`` and check it: the window's size at
    the device pixel ratio, and not blank (more than ``colours_min`` distinct colours)."""
    png = driver.get_screenshot_as_png()
    path = directory / f"{name}.png"
    path.write_bytes(png)
    expected = driver.execute_script(
        "return [Math.round(innerWidth * devicePixelRatio), Math.round(innerHeight * devicePixelRatio)]"
    )
    assert png_size(png) == tuple(expected), f"{name}: screenshot {png_size(png)}, viewport {expected}"
    colours = distinct_colours(driver, png)
    assert colours > colours_min, f"{name}: the screenshot looks blank ({colours} colours), see {path}"
    return path
