"""Debian's headless Chromium driven by Selenium, for the browser tests (viewer, Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def chromium_or_skip() -> None:
    """Skip the calling test when Chromium, ChromeDriver or Selenium is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(
            f"headless Chromium not installed ({', '.join(missing)} missing): "
            "apt-get install chromium chromium-driver"
        )
    pytest.importorskip("selenium", reason="selenium not installed (pip install selenium)")


def start_chromium(profile: Path, width: int, height: int):
    """A headless Chromium (software WebGL, no network chatter) with its own empty profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--use-angle=swiftshader",
        "--enable-unsafe-swiftshader",
        "--no-sandbox",
        "--no-first-run",
        # this machine's network is closed: without these Chromium keeps dialling out
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
