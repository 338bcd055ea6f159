"""The results page in a real headless browser: Debian's chromium driven by selenium through Debian's chromedriver
(both named by path, so nothing is downloaded at run time). Every image decodes, the console logs no error, and a
screenshot is kept in the test's folder. Skipped where chromium, chromedriver or selenium is missing."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.report_results import NAMES, write_all
from topologies import runner

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1000")

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
                                       "chromium-driver; make install does it as root)")


@pytest.fixture
def browser(tmp_path, monkeypatch):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extras: pip install -e .[test])")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    def no_download(*args, **kwargs):
        raise AssertionError("Selenium Manager was asked for a browser or driver: nothing may be downloaded")

    monkeypatch.setattr(SeleniumManager, "binary_paths", no_download)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_report_opens_in_a_browser_with_every_image_decoded_and_no_console_error(tmp_path, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    write_all(tmp_path / "results", "tiny")
    out, err = io.StringIO(), io.StringIO()
    assert runner.main(["report", str(tmp_path / "results")], out=out, err=err) == 0, err.getvalue()
    page = Path(out.getvalue().split("report: ")[1].strip())

    browser.get(page.as_uri())
    WebDriverWait(browser, 30).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"))
    images = browser.execute_script("return Array.from(document.images).map(i => [i.alt, i.naturalWidth])")
    assert len(images) == 2 * len(NAMES)  # each experiment's plot and its targets chart
    assert all(width > 0 for _, width in images), [alt for alt, width in images if not width]
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    sections = browser.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)")
    assert sections == list(NAMES)
    assert browser.execute_script("return document.querySelectorAll('.verdict.met').length") > 0

    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, min(height, 16000))
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
