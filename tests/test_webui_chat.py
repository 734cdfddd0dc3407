"""The chat itself in a real browser (issue 17): an answer streams in token
by token with its first token painted within a frame of its first byte;
Stop frees the server's slot at once and keeps what streamed; conversations
and their settings survive a reload and reach the request; editing a user
message continues from there.

The page, server and browser are tests/_webui_browser.py's (chromium through
Playwright; a skip when either is missing, a failure under ``CI=true``).
The fake engine echoes the templated prompt one token per TOKEN_S, so each
answer contains the user message that asked for it.
"""
from __future__ import annotations

import json
import re
import statistics
import time

import requests

from frontends import testing as _server

from _webui_browser import answers, browser, page, send, srv, wait_idle, wait_js  # noqa: F401 (fixtures)

HOLD = "Tell me a long story please, with many words in it, one after another, for a while."


# Records, in the page, when the chat request was sent, when its first body
# byte arrived (fetch wrapped), every distinct text the last answer showed
# (a MutationObserver), and the first animation frame after the first one.
PROBE = """
window.__rs = {req: null, first: null, dom: null, paint: null, texts: []};
const realFetch = window.fetch;
window.fetch = async function (url, opts) {
  const t0 = performance.now();
  const r = await realFetch.apply(this, arguments);
  if (!String(url).includes('chat/completions') || !r.body) return r;
  const rs = window.__rs;
  Object.assign(rs, {req: t0, first: null, dom: null, paint: null, texts: []});
  const reader = r.body.getReader();
  const body = new ReadableStream({
    async pull(c) {
      const {done, value} = await reader.read();
      if (done) { c.close(); return; }
      if (rs.first === null) rs.first = performance.now();
      c.enqueue(value);
    },
    cancel(why) { return reader.cancel(why); },
  });
  return new Response(body, {status: r.status, statusText: r.statusText, headers: r.headers});
};
new MutationObserver(() => {
  const rs = window.__rs, b = document.querySelector('#msgs .msg.assistant:last-child .body');
  const t = b ? b.textContent : '';
  if (rs.req === null || !t || rs.texts[rs.texts.length - 1] === t) return;
  rs.texts.push(t);
  if (rs.dom === null) { rs.dom = performance.now(); requestAnimationFrame(() => { rs.paint = performance.now(); }); }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


def test_tokens_stream_one_by_one_and_first_token_latency(browser, srv):
    ctx = browser.new_context()
    try:
        ctx.add_init_script(PROBE)
        pg = ctx.new_page()
        pg.goto(srv.url("/"))
        gaps, ttfts = [], []
        for i in range(3):
            send(pg, f"Hello number {i}, how are you today?")
            wait_idle(pg)
            rs = pg.evaluate("window.__rs")
            texts = rs["texts"]
            final = answers(pg)[-1]
            # the answer grew token by token: many distinct states, each a prefix of the next
            assert len(texts) >= 8, texts
            assert all(texts[k + 1].startswith(texts[k]) for k in range(len(texts) - 1)), texts
            assert f"Hello number {i}" in final
            gaps.append(rs["paint"] - rs["first"])
            ttfts.append(rs["first"] - rs["req"])
        stats = pg.locator("#msgs .msg.assistant .stats").last.inner_text()
        assert re.search(r"[\d.]+ tokens/s .* prompt \d+ tokens .* \d+ cached", stats), stats
        print(f"\nfirst byte after request (server TTFT) ms: {[round(x, 1) for x in ttfts]}; "
              f"first token painted after first byte ms: {[round(x, 1) for x in gaps]}")
        assert statistics.median(gaps) < 50, gaps
        # the later requests share the conversation's prefix: the prefix cache shows
        cached = int(re.search(r"(\d+) cached", stats).group(1))
        assert cached > 0, stats
    finally:
        ctx.close()


def test_stop_frees_the_slot(page, srv):
    page.click("#gear")
    page.fill("#s-max_tokens", "3000")  # the fake engine then streams for half a minute
    send(page, HOLD)
    wait_js(page, "(document.querySelector('#msgs .msg.assistant .body')?.textContent.length || 0) > 40")
    assert any(s["is_processing"] for s in requests.get(srv.url("/slots")).json())
    page.click("#stop")
    t0 = time.monotonic()
    while any(s["is_processing"] for s in requests.get(srv.url("/slots")).json()):
        assert time.monotonic() - t0 < _server.WITHIN, "slot still busy after Stop"
        time.sleep(0.02)
    freed = time.monotonic() - t0
    wait_idle(page)
    print(f"\nStop to slot idle in /slots: {freed * 1000:.0f} ms")
    assert "stopped" in page.locator("#msgs .msg.assistant .stats").last.inner_text()
    assert any(e[0] == "cancel" for e in srv.events())
    # what streamed before Stop is kept, and Regenerate asks again
    before = answers(page)[-1]
    assert len(before) > 40
    page.fill("#s-max_tokens", "5")
    page.click("#msgs .msg.assistant .regen")
    wait_idle(page)
    assert len(page.locator("#msgs .msg").all()) == 2 and answers(page)[-1] != before


def test_conversations_survive_reload(page):
    page.click("#gear")
    page.fill("#s-system", "You are terse.")
    page.fill("#s-temperature", "0.3")
    send(page, "First chat, first question")
    wait_idle(page)
    page.click(".conv.cur .rename")
    page.fill(".renaming", "Renamed chat")
    page.press(".renaming", "Enter")
    page.click("#new")
    send(page, "Second chat question")
    wait_idle(page)
    page.click("#new")
    send(page, "Third chat, to be deleted")
    wait_idle(page)
    page.click(".conv.cur .delete")
    page.reload()
    names = page.locator("#convs .conv .name").all_inner_texts()
    assert sorted(names) == ["Renamed chat", "Second chat question"], names
    page.click("#convs .conv .name >> text=Renamed chat")
    assert page.locator("#msgs .msg.user .body").all_inner_texts() == ["First chat, first question"]
    assert "First chat, first question" in answers(page)[0]
    assert page.input_value("#s-temperature") == "0.3" and page.input_value("#s-system") == "You are terse."
    # the settings reach the request
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "follow-up")
    body = json.loads(req.value.post_data)
    assert body["temperature"] == 0.3 and body["stream"] is True
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    wait_idle(page)


def test_edit_a_user_message_and_continue(page):
    send(page, "alpha question")
    wait_idle(page)
    send(page, "beta question")
    wait_idle(page)
    assert len(page.locator("#msgs .msg").all()) == 4
    page.locator("#msgs .msg.user .edit").first.click()
    page.fill("#msgs textarea.editbox", "gamma question")
    with page.expect_request("**/v1/chat/completions") as req:
        page.press("#msgs textarea.editbox", "Enter")
    wait_idle(page)
    msgs = json.loads(req.value.post_data)["messages"]
    assert msgs == [{"role": "user", "content": "gamma question"}]
    assert page.locator("#msgs .msg.user .body").all_inner_texts() == ["gamma question"]
    assert "gamma question" in answers(page)[0] and len(answers(page)) == 1
