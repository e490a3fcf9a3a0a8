"""The real-browser test's gate: without Chromium it skips on a developer's machine (saying how to install
it) and fails under CI, where .ci/run installs the browser."""

from __future__ import annotations

import pytest
from test_browser import BROWSER_MISSING, browser_binaries


def _nothing(name: str) -> None:
    return None


def test_missing_browser_skips_without_ci() -> None:
    with pytest.raises(pytest.skip.Exception) as skipped:
        browser_binaries(which=_nothing, environ={})
    assert BROWSER_MISSING in str(skipped.value) and "apt-get install chromium chromium-driver" in BROWSER_MISSING


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_missing_browser_fails_under_ci(ci: str) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        browser_binaries(which=_nothing, environ={"CI": ci})
    assert BROWSER_MISSING in str(failed.value)


def test_present_browser_is_used_either_way() -> None:
    found = {"chromium": "/usr/bin/chromium", "chromedriver": "/usr/bin/chromedriver"}
    for environ in ({}, {"CI": "true"}):
        assert browser_binaries(which=found.get, environ=environ) == ("/usr/bin/chromium", "/usr/bin/chromedriver")
