"""/slots/{id}?action=save|restore with --slot-save-path (llama-server's slot files).

The name checks run against the fake engine (no model): without the flag
501, every traversal or forbidden name 400 and no file appears outside the
directory. With the real default model: save a slot's KV, erase it, restore
it (into the same slot and into another), and the next request on it reports
the restored tokens as cached (timings.cache_n) and gives the same greedy
answer as the request that first computed them.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

import pytest
import requests

from engine.slotfile import slot_path, valid_filename
from frontends import testing as S

BAD_NAMES = ["../evil", "..", ".", "a/b", "/etc/passwd", "a\\b", "x..y", "", " lead", "trail ", "dot.", "c:d",
             "q?", "st*r", "p|pe", "l<t", "g>t", 'q"t', "nul\x00b", "tab\tb", "\x7f", "\u2215slash", "\uff0e\uff0e",
             "x" * 256, "\ufeffbom"]


def test_valid_filename_matches_llama_cpp_rules(tmp_path) -> None:
    for name in BAD_NAMES:
        assert not valid_filename(name), repr(name)
        with pytest.raises(ValueError):
            slot_path(str(tmp_path), name)
    for name in ["slot0.bin", "a b", "ünïcødé.kv", "x" * 255, ".hidden", "a.b.c"]:
        assert valid_filename(name), repr(name)
        assert os.path.dirname(slot_path(str(tmp_path), name)) == os.path.realpath(tmp_path)
    with pytest.raises(ValueError):
        slot_path("", "ok.bin")  # no directory configured


def test_without_flag_501_and_bad_names_400(tmp_path) -> None:
    with S.TestClient() as c:
        r = c.simulate_post("/slots/0", params={"action": "save"}, json={"filename": "a.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json["error"]["message"], r.text
        assert c.simulate_post("/slots/0", params={"action": "erase"}).status_code == 200  # erase needs no flag
    d = tmp_path / "slots"
    d.mkdir()
    with S.TestClient("--slot-save-path", str(d)) as c:
        for action in ("save", "restore"):
            for name in BAD_NAMES + [None, 7, ["a"]]:
                r = c.simulate_post("/slots/0", params={"action": action}, json={"filename": name})
                assert r.status_code == 400, (action, name, r.text)
                assert r.json["error"]["message"] == "Invalid filename"
            r = c.simulate_post("/slots/9", params={"action": action}, json={"filename": "ok.bin"})
            assert r.status_code == 400 and r.json["error"]["message"] == "Invalid slot ID"
            # a valid name reaches the (fake) engine, which answers instead of hanging
            r = c.simulate_post("/slots/0", params={"action": action}, json={"filename": "ok.bin"})
            assert r.status_code == 501 and "real engine" in r.json["error"]["message"]
    assert os.listdir(d) == [] and sorted(os.listdir(tmp_path)) == ["slots"]


# ----------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Iterator[tuple[S.Server, str]]:
    d = str(tmp_path_factory.mktemp("slots"))
    s = S.Server("-c", "2048", "-np", "2", "-t", "2", "-w", "1", "--slot-save-path", d, *S.INVARIANT)
    try:
        yield s, d
    finally:
        rc, left = s.finish()
    assert rc == 0 and left == [], (rc, left)


def _post(srv: S.Server, path: str, body: dict | None = None) -> requests.Response:
    return requests.post(srv.url(path), json=body, timeout=120)


def _complete(srv: S.Server, slot: int) -> dict:
    body = {"prompt": "The history of the printing press in Europe began in Mainz, where", "n_predict": 8,
            "temperature": 0, "id_slot": slot, "cache_prompt": True, "ignore_eos": True}
    r = _post(srv, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def _n_past(srv: S.Server, slot: int) -> int:
    """Tokens in the slot's KV, from the control block's slot table."""
    a = srv.arena()
    try:
        return int(a.slots[slot]["n_past"])
    finally:
        a.close()


def _settled_n_past(srv: S.Server, slot: int, want: int) -> int:
    """n_past once the engine applied an erase (answered before it runs, as llama-server's)."""
    t = time.monotonic() + 5
    while _n_past(srv, slot) != want and time.monotonic() < t:
        time.sleep(0.01)
    return _n_past(srv, slot)


def test_save_erase_restore_then_cached(real) -> None:
    srv, d = real
    first = _complete(srv, 0)
    n = first["tokens_evaluated"]
    held = _n_past(srv, 0)
    assert held == n + 8 - 1  # the prompt and every answer token but the last sit in the KV
    r = _post(srv, "/slots/0?action=save", {"filename": "s0.bin"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["id_slot"] == 0 and j["filename"] == "s0.bin" and j["n_saved"] == held
    assert j["n_written"] == os.path.getsize(os.path.join(d, "s0.bin")) > 0 and j["timings"]["save_ms"] >= 0
    assert _post(srv, "/slots/0?action=erase").json()["n_erased"] == held
    assert _settled_n_past(srv, 0, 0) == 0
    r = _post(srv, "/slots/0?action=restore", {"filename": "s0.bin"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j == {"id_slot": 0, "filename": "s0.bin", "n_restored": held, "n_read": j["n_read"],
                 "timings": {"restore_ms": j["timings"]["restore_ms"]}}
    assert j["n_read"] == os.path.getsize(os.path.join(d, "s0.bin"))
    assert _n_past(srv, 0) == held
    again = _complete(srv, 0)
    assert again["timings"]["cache_n"] == n - 1 and again["timings"]["prompt_n"] == 1, again["timings"]
    assert again["content"] == first["content"]
    # into the other slot: its KV is replaced by the file's
    r = _post(srv, "/slots/1?action=restore", {"filename": "s0.bin"})
    assert r.status_code == 200 and r.json()["n_restored"] == held, r.text
    other = _complete(srv, 1)
    assert other["timings"]["cache_n"] == n - 1 and other["content"] == first["content"]


def test_restore_errors_leave_an_empty_slot(real) -> None:
    srv, d = real
    _complete(srv, 1)
    r = _post(srv, "/slots/1?action=restore", {"filename": "missing.bin"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("Unable to restore slot"), r.text
    with open(os.path.join(d, "junk.bin"), "wb") as f:
        f.write(b"not a state file" * 8)
    r = _post(srv, "/slots/1?action=restore", {"filename": "junk.bin"})
    assert r.status_code == 400, r.text
    assert _n_past(srv, 1) == 0
    # and the slot still serves (from the prefix cache: slot 0 holds this prompt)
    assert _complete(srv, 1)["tokens_predicted"] == 8
    r = _post(srv, "/slots/0?action=save", {"filename": "../escape.bin"})
    assert r.status_code == 400 and not os.path.exists(os.path.join(os.path.dirname(d), "escape.bin"))
