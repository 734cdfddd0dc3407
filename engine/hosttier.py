"""The host tier of the prefix cache (``--cache-host DIR``): prompt KV that
the instances on one host hand each other (issue 23).

Why: behind a gateway every instance evaluates the prompt prefixes its
peers already hold: a shared system prompt once per instance (bench_fleet's
chat: two instances cannot go below 1.17x the floor), a conversation moved
by a least-connections balancer all over again. Instances of one model with
the same KV settings on one host can load a peer's KV instead of evaluating
it: a `state_get` blob (engine/model.py) in a directory on tmpfs, found by
its tokens, loaded with `state_set` as a RAM-tier blob is.

Files, in DIR/<key>/ (``key``: a digest of everything a blob's layout
depends on, `settings_key`, so instances with other settings never read
each other's), each a header (magic, token count, swa_lo, blob bytes), the
tokens (int32) and the blob, named ``<pid>-<start>-<n>`` (``start``: when
this HostTier was made, so a name never comes back with other contents,
after an engine sleep or with a pid used again):
- ``<name>.kv``: an entry: the KV of a prompt this instance evaluated
  (SlotCache.prompt_done publishes it); immutable;
- ``<name>.claim``: a prompt this instance is about to evaluate or is
  evaluating, no blob (the header's last field is its CLOCK_MONOTONIC time
  in ns instead): a peer about to evaluate the same prefix waits for the
  entry instead (SlotCache.defer, at most SlotCache.peer_wait); removed
  when the entry is published or the request ends.
Two instances that get the same prefix at once (a fleet's first requests)
must not both evaluate it: each writes its claim first, then looks for an
older claim sharing the prefix ((time, pid) order) and waits if there is
one. Of two claims, the later written sees the earlier, so at least one
waits unless their times and writes cross (then both evaluate: a lost
chance). Never a wait on nothing: a claim is written only for a prompt that
will publish its entry, a peer waits only for a claim whose entry would give
it the prefix, and `settle` drops, after every intake, the claims of queued
requests that neither started nor wait themselves (no free slot, cancelled,
refused).
Every file is written under a temporary name and renamed: a reader sees a
whole file or none.

Lifetime: each instance deletes only its own files (its oldest entries past
its byte bound, a claim when done, everything at close), except the files of
a pid that is not alive (a crashed instance), which whoever finds them
deletes (so the instances must see each other's pids: one pid namespace;
an instance also sweeps every key's directory when it opens and closes, so
a crash's files go at the next start); the last instance out removes the
directories. A reader that has opened a file reads it whole even if its
owner unlinks it meanwhile, so no lock is shared between processes. Files
0600 in a DIR/<key> of 0700 that must belong to this user (checked at start).

Usable prefixes follow the RAM tier's rule (engine/lookup.py): a blob of n
tokens serves any c <= n without a sliding window; with one (gemma 3) it
holds the window of its last position only, so it serves c = n, or any c
when n fits in the window (a first turn behind a shared system prompt does).
Runs on the engine loop's thread only.
"""
from __future__ import annotations

import hashlib
import os
import struct
import time

import numpy as np

from ipc import shm

from .kvevents import SetupError
from .lookup import window_ok
from .prefix import common

MAGIC = b"RSHOST01"
HEAD = struct.Struct("<8sIiQ")  # magic, tokens, swa_lo, blob bytes (a claim: its monotonic ns)
STALE_NS = 60 * 10**9  # a claim this old is ignored (its owner is stuck, or it leaked): peers wait no longer anyway


def settings_key(parts: tuple) -> str:
    """The directory of one blob layout: a digest of the settings it depends on."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    """Runs and is not a zombie (/proc, ipc/shm.py): ``kill(pid, 0)`` also
    answered yes for a SIGKILLed instance its parent had not reaped, whose
    files (up to --cache-host-mib of tmpfs) then stayed. A pid used again by
    another process still reads as alive: its files go once that one ends."""
    return shm.alive(pid)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def open_host(cfg, model) -> HostTier:
    """The host tier for ``cfg.cache_host``: its directory keyed by the model
    file and every setting a `state_get` blob's layout depends on."""
    import llama_cpp

    path = os.path.realpath(cfg.model_path())
    st = os.stat(path)
    key = settings_key((path, st.st_size, st.st_mtime_ns, llama_cpp.__version__, model.n_ctx_slot,
                        cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn, bool(getattr(model, "swa_full", False))))
    try:
        return HostTier(cfg.cache_host, key, model.n_swa, cfg.cache_host_mib)
    except OSError as e:
        raise SetupError(f"--cache-host {cfg.cache_host}: {e}") from e


class HostTier:
    """One instance's view of the host tier (module doc)."""

    def __init__(self, root: str, key: str, n_swa: int, mib: int) -> None:
        self.root, self.dir = root, os.path.join(root, key)
        self.n_swa = n_swa
        self.limit = max(mib, 0) << 20
        self.pid = os.getpid()
        self.seq = 0
        self.mine: list[tuple[str, int]] = []  # own entries (name, bytes), oldest first
        self.nbytes = 0
        self.claims: dict[object, tuple[str, int]] = {}  # request key, then slot -> (claim file, its ns)
        self.known: dict[str, tuple[np.ndarray, int, int]] = {}  # file -> (tokens, swa_lo, last field)
        self.loads = self.publishes = self.waits = 0
        self.start = time.monotonic_ns()
        self.held: set[object] = set()  # requests that waited for a peer's claim in this intake (their claims stay)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)  # fails loudly at start where DIR cannot be made
        st = os.stat(self.dir)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{self.dir} must belong to this user, mode 0700 (is {oct(st.st_mode & 0o777)})")
        self.sweep()

    # ------------------------------------------------------------ files
    def _write(self, ext: str, tokens: np.ndarray, lo: int, blob: np.ndarray | None, t_ns: int = 0) -> str:
        """A new own file, whole or not at all; its name ('' if it could not be written)."""
        self.seq += 1
        name = f"{self.pid}-{self.start}-{self.seq}.{ext}"
        tmp = os.path.join(self.dir, f".{name}")
        toks = np.array(tokens, np.int32)  # a copy: ``known`` keeps it, and a slot's cache array changes
        nb = t_ns if blob is None else int(blob.nbytes)
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)  # a peer leaving may have removed it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(HEAD.pack(MAGIC, len(toks), int(lo), nb))
                f.write(toks.tobytes())
                if blob is not None:
                    f.write(memoryview(blob).cast("B"))
            os.rename(tmp, os.path.join(self.dir, name))
        except OSError:
            _unlink(tmp)
            return ""
        self.known[name] = (toks, int(lo), nb)
        return name

    def _scan(self, d: str = "") -> list[tuple[str, int, str]]:
        """(name, pid, kind) of every file now (of directory ``d``, default
        this key's); a dead pid's files are deleted."""
        try:
            names = os.listdir(d or self.dir)
        except OSError:
            return []
        out = []
        alive: dict[int, bool] = {self.pid: True}
        for nm in names:
            stem, _, kind = nm.lstrip(".").rpartition(".")
            try:
                pid = int(stem.split("-")[0])
            except ValueError:
                continue
            if pid not in alive:
                alive[pid] = _alive(pid)
            if not alive[pid]:
                _unlink(os.path.join(d or self.dir, nm))
                continue
            if not nm.startswith("."):
                out.append((nm, pid, kind))
        if not d and len(self.known) > len(out):  # forget vanished files
            live = {nm for nm, _, _ in out}
            self.known = {k: v for k, v in self.known.items() if k in live}
        return out

    def sweep(self) -> None:
        """Delete dead pids' files in every key's directory; remove the empty ones."""
        try:
            keys = os.listdir(self.root)
        except OSError:
            return
        for k in keys:
            d = os.path.join(self.root, k)
            if os.path.isdir(d) and not os.path.islink(d):
                self._scan(d)
                if d != self.dir:
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass

    def _parse(self, name: str, blob: bool = False) -> tuple[np.ndarray, int, int, np.ndarray | None] | None:
        """A file's (tokens, swa_lo, last header field, its blob if asked); None: gone or not whole."""
        try:
            with open(os.path.join(self.dir, name), "rb") as f:
                magic, n, lo, last = HEAD.unpack(f.read(HEAD.size))
                toks = np.frombuffer(f.read(4 * n), np.int32)
                b = np.frombuffer(f.read(last), np.uint8) if blob else None
        except (OSError, struct.error):
            return None
        if magic != MAGIC or len(toks) != n or (b is not None and (last == 0 or b.nbytes != last)):
            return None
        return toks, lo, last, b

    def _read(self, name: str) -> tuple[np.ndarray, int, int] | None:
        """A file's (tokens, swa_lo, last header field), read once per name."""
        got = self.known.get(name)
        if got is None:
            p = self._parse(name)
            if p is None:
                return None
            got = self.known[name] = p[:3]
        return got

    def usable(self, n: int, lo: int, c: int) -> bool:
        """A blob of n tokens whose sliding-window cells start at lo gives exactly the prefix c."""
        return 0 < c <= n and window_ok(self.n_swa, lo, c)

    # ------------------------------------------------------------ lookups
    def best(self, prompt: np.ndarray, most: int) -> tuple[int, str, int, int]:
        """(c, file, n, swa_lo) of the entry giving the longest usable prefix
        c <= most of ``prompt`` (c 0: none). Own entries count too: they
        outlive what the slots and RAM keep."""
        top = (0, "", 0, 0)
        for nm, _, kind in self._scan():
            if kind != "kv":
                continue
            got = self._read(nm)
            if got is None:
                continue
            toks, lo, _ = got
            c = min(common(toks, prompt), most)
            if c > top[0] and self.usable(len(toks), lo, c):
                top = (c, nm, len(toks), lo)
        return top

    def load(self, name: str) -> np.ndarray | None:
        """The blob of entry ``name`` (None: gone, not whole, or no longer the
        tokens `best` matched: the file a name now holds is checked, not trusted)."""
        want = self.known.get(name)
        got = self._parse(name, blob=True)
        if want is None or got is None or not np.array_equal(got[0], want[0]):
            self.known.pop(name, None)
            return None
        return got[3]

    def behind(self, key: object, prompt: np.ndarray, need: int) -> bool:
        """Should request ``key`` wait for a peer (module doc)? It claims the
        prompt (once: the claim is written before the directory is read, which
        is what orders two instances), then: no if an entry already gives
        ``need`` tokens of ``prompt`` (pick loads it), yes if an older peer
        claim's entry would. One listing of the directory for both questions."""
        now = time.monotonic_ns()
        if key not in self.claims:
            self.claim(key, prompt)
        mine = (self.claims.get(key, ("", now))[1], self.pid)
        most = len(prompt) - 1
        older = False
        for nm, pid, kind in self._scan():
            got = self._read(nm)
            if got is None:
                continue
            toks, lo, last = got
            c = min(common(toks, prompt), most)
            if c < need:
                continue
            if kind == "kv" and self.usable(len(toks), lo, c):
                return False  # pick loads it
            # a claim's entry will hold the window of its last position (lo as a blob of it would have)
            will = max(0, len(toks) - self.n_swa) if self.n_swa else 0
            if kind == "claim" and pid != self.pid and now - last < STALE_NS and (last, pid) < mine \
                    and self.usable(len(toks), will, c):
                older = True
        if older:
            self.held.add(key)
        return older

    def settle(self) -> None:
        """After an intake: the claims of requests still queued that did not
        wait for a peer go (no slot yet, cancelled, refused: they will not
        publish soon, and peers must not wait for them); they claim again
        when they are looked at next."""
        for k in [k for k in self.claims if isinstance(k, tuple) and k not in self.held]:
            self.unclaim(k)
        self.held.clear()

    # ------------------------------------------------------------ own files
    def claim(self, key: object, prompt: np.ndarray) -> None:
        """Tell the peers ``prompt`` is about to be evaluated here (for request or slot ``key``)."""
        self.unclaim(key)
        t = time.monotonic_ns()
        name = self._write("claim", prompt, 0, None, t)
        if name:
            self.claims[key] = (name, t)

    def move(self, key: object, slot: int) -> bool:
        """Request ``key``'s claim now belongs to its slot; False: it had none."""
        got = self.claims.pop(key, None)
        if got is None:
            return False
        self.unclaim(slot)
        self.claims[slot] = got
        return True

    def unclaim(self, key: object) -> None:
        name = self.claims.pop(key, ("", 0))[0]
        if name:
            _unlink(os.path.join(self.dir, name))
            self.known.pop(name, None)

    def publish(self, tokens: np.ndarray, blob: np.ndarray, lo: int) -> bool:
        """Offer the KV of ``tokens`` to the peers, unless an entry already
        gives all of it; own oldest entries go past the byte bound."""
        n = len(tokens)
        if blob.nbytes > self.limit or self.best(tokens, n)[0] >= n:
            return False
        name = self._write("kv", tokens, lo, blob)
        if not name:
            return False
        self.mine.append((name, int(blob.nbytes)))
        self.nbytes += int(blob.nbytes)
        while self.nbytes > self.limit and len(self.mine) > 1:
            old, nb = self.mine.pop(0)
            _unlink(os.path.join(self.dir, old))
            self.known.pop(old, None)
            self.nbytes -= nb
        self.publishes += 1
        return True

    def close(self) -> None:
        """Delete every own file; the last instance out removes the directories."""
        for slot in list(self.claims):
            self.unclaim(slot)
        for name, _ in self.mine:
            _unlink(os.path.join(self.dir, name))
        self.mine, self.nbytes = [], 0
        self.sweep()  # and any dead peer's
        for d in (self.dir, self.root):
            try:
                os.rmdir(d)
            except OSError:
                pass
