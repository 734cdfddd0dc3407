"""What both web UI test modules share (tests/test_webui.py,
tests/test_webui_chat.py): the server, the browser, a page on it, and the
few ways a test drives and waits on the page.

The browser is Debian's ``chromium`` (``apt-get install chromium``) through
Playwright's Python package pointed at that binary (Playwright's own
browser download is never used). The ``browser`` fixture skips, saying what
is missing, when either is absent, except under ``CI=true``, where a
missing browser fails: a skip there would hide a broken install.

The server is a real ringserve with the fake engine (frontends/testing/fake_engine.py):
it answers by echoing the templated prompt one token per FAKE_TOKEN_S, so a
user message comes back inside the answer. The fixtures are module-scoped:
each test module that imports them gets its own server and browser.
"""
from __future__ import annotations

import os

import pytest

from frontends.testing import FakeServer as Server

from frontends import testing as _server

CHROMIUM = os.environ.get("RINGSERVE_CHROMIUM", "/usr/bin/chromium")
TOKEN_S = 0.01  # the fake engine's time per token: slow enough to watch a stream grow (a state per frame or so)


@pytest.fixture(scope="module")
def srv():
    s = Server(env={"FAKE_TOKEN_S": str(TOKEN_S)}).wait_ready()
    yield s
    assert s.stop() == 0


def _missing() -> str:
    if not os.path.exists(CHROMIUM):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return ""


@pytest.fixture(scope="module")
def browser():
    why = _missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the browser tests cannot run: {why}")
        pytest.skip(f"browser tests skipped: {why}")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        # root needs --no-sandbox; --disable-dev-shm-usage keeps chromium's shared memory out of /dev/shm
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def page(browser, srv):
    ctx = browser.new_context(viewport={"width": 1100, "height": 760})
    pg = ctx.new_page()
    pg.set_default_timeout(15_000)
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.goto(srv.url("/"))
    yield pg
    assert dialogs == []  # no alert() ever ran
    ctx.close()


def send(pg, text: str) -> None:
    pg.fill("#input", text)
    pg.press("#input", "Enter")


def wait_idle(pg) -> None:
    """Until the answer has ended (Send is back)."""
    pg.wait_for_selector("#send", state="visible")
    pg.wait_for_selector("#stop", state="hidden")


def wait_js(pg, expr: str, timeout: float = 15.0) -> None:
    """Poll a JS expression from here: the page's CSP (no eval) refuses
    Playwright's wait_for_function, which evaluates a string in the page."""
    assert _server.wait_for(lambda: pg.evaluate(expr), timeout) is not None, f"timed out waiting for {expr}"


def answers(pg) -> list[str]:
    return pg.locator("#msgs .msg.assistant .body").all_inner_texts()
