"""Take the README's screenshot of the chat page (docs/img/webui.png).

Starts a ringserve (the default model, or ``--fake`` for the echoing fake
engine), opens the page in the system chromium through Playwright, has a
short conversation, and writes a full-page PNG. Needs ``apt-get install
chromium`` and the test extra's playwright; never ``playwright install``.

    python scripts/webui_screenshot.py [--out docs/img/webui.png] [--fake]
"""
from __future__ import annotations

import argparse
import os
import sys

from frontends import testing as _server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = [
    "What is the capital of France?",
    "And what is the capital of Italy?",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "webui.png"))
    ap.add_argument("--fake", action="store_true", help="the fake engine (echoes the prompt) instead of the model")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with _server.Server("-c", "4096", "-np", "2", "-w", "1", "--threads-http", "8", "--temp", "0.2", "-s", "7",
                        fake=args.fake) as srv, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            pg = b.new_page(viewport={"width": args.width, "height": args.height})
            pg.set_default_timeout(120_000)
            pg.goto(srv.url("/"))
            pg.click("#gear")
            pg.fill("#s-max_tokens", "48")
            pg.fill("#s-temperature", "0")
            pg.click("#gear")
            # two conversations in the sidebar; the second goes on, so its prompt hits the slot's cache
            for title, questions in (("Haiku", ["Write a haiku about the sea."]), ("Capitals", QUESTIONS)):
                pg.click("#new")
                for q in questions:
                    pg.fill("#input", q)
                    pg.press("#input", "Enter")
                    pg.wait_for_selector("#send", state="visible")
                pg.click(".conv.cur .rename")
                pg.fill(".renaming", title)
                pg.press(".renaming", "Enter")
            pg.wait_for_timeout(300)
            pg.screenshot(path=args.out, full_page=True)
            print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
        finally:
            b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
