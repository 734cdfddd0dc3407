"""scripts/bench_fleet.py's pieces: the instances, the front-ends in front
of them (nginx least_conn from deploy/nginx.conf, smg with a policy and its
flags, or none), the chat wire the workloads are sent over, each
instance's own counters, and the kill scenario.

Why /v1/chat/completions: smg forwards only the OpenAI-style paths
(/completion, /metrics and the other llama-server paths answer 404
through it), and chat is what a gateway's prefix routing sees in practice:
cache_aware hashes the messages' text. The floor is counted on the prompt
the instance evaluates: the messages through the model's chat template
(frontends/text/chat.py, as the instances render it), tokenized.

Why each instance's own /metrics: the gateway hides which instance did
what. ``llamacpp:prompt_tokens_total`` counts the prompt tokens an engine
evaluated (cached ones are ``llamacpp:prompt_tokens_cached_total``) and
``ringserve:requests_total`` the requests it accepted; the difference
between two scrapes is that run's work per instance.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import _cache_workloads as W
import loadgen
from frontends.testing import HOST, Proc, Server, free_port, get, md5, metrics, procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NGINX_CONF = os.path.join(ROOT, "deploy", "nginx.conf")
# smg's flags every smg front-end here gets: loopback, its Prometheus
# endpoint on a free port (the default 29000 would collide between runs),
# warnings only (its info log is a line per request).
SMG_BASE = ("--log-level", "warn")
# Every smg front-end but the defaults: probe /health every second and take
# a worker out at the first failure, back in at the first success (the
# defaults, 60 s and 3 failures, leave a dead instance in rotation for
# minutes; smg's retries hide it, at a cost in latency); poll /v1/loads
# every second (default 10 s).
SMG_HEALTH = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
              "--health-success-threshold", "1", "--load-monitor-interval", "1")
# The recommended configuration: cache_aware, and a request that names its
# session (x-smg-routing-key: the conversation, the document) goes where
# that session went before; a new session goes to the instance with the
# fewest requests. docs/DEPLOYMENT.md says why.
SMG_STICKY = ("--policy", "cache_aware", *SMG_HEALTH, "--sticky-sessions", "--assignment-mode")
SMG_RECOMMENDED = (*SMG_STICKY, "min_load")
# Without a session key: cache_aware spills a request from the instance its
# prefix matches to the least loaded one once the first holds more than one
# request above the mean (the defaults, 64 and 1.5x, never trip with a few
# slots an instance: everything sharing a system prompt piles on one).
SMG_NOKEY = ("--policy", "cache_aware", *SMG_HEALTH, "--balance-abs-threshold", "1", "--balance-rel-threshold", "1.0")


@dataclass
class Front:
    """One front-end: its table label, kind (nginx, smg, direct) and smg flags."""

    key: str
    label: str
    kind: str
    flags: tuple[str, ...] = ()
    health_s: float = 0.0  # the interval it notices a dead instance in (nginx: at the first failed request)


FRONTS = {f.key: f for f in (
    Front("nginx", "nginx least_conn", "nginx"),
    Front("smg", "smg cache_aware + session key (recommended)", "smg", SMG_RECOMMENDED, 1.0),
    Front("smg-nokey", "smg cache_aware, no session key", "smg", SMG_NOKEY, 1.0),
    # the recommended one, but a new session goes to the instance with the fewest sessions, not requests
    Front("smg-group", "smg cache_aware + session key, min_group", "smg",
          (*SMG_STICKY, "min_group"), 1.0),
    Front("smg-default", "smg cache_aware (defaults)", "smg", ("--policy", "cache_aware"), 60.0),
    Front("smg-p2", "smg power_of_two", "smg", ("--policy", "power_of_two", *SMG_HEALTH), 1.0),
    Front("smg-prefix-hash", "smg prefix_hash", "smg", ("--policy", "prefix_hash", *SMG_HEALTH), 1.0),
)}


def find(name: str, env: str, extra: tuple[str, ...] = ()) -> str:
    """An executable: $ENV, PATH, this interpreter's bin/, then ``extra``; "" if none."""
    cands = [os.environ.get(env, ""), shutil.which(name) or "", os.path.join(os.path.dirname(sys.executable), name),
             *extra]
    return next((c for c in cands if c and os.access(c, os.X_OK)), "")


_FLEETS = itertools.count()  # this process's fleets, for their --cache-host directories
NGINX = find("nginx", "NGINX", ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"))
SMG = find("smg", "SMG")


def start_instances(n: int, model: str, slots: int, ctx: int, threads: int, extra: list[str]) -> list[Server]:
    """n ringserve instances on free ports, started side by side, all ready (or all stopped, raising)."""
    flags = ["-m", model, "-np", str(slots), "-c", str(ctx), "-t", str(threads), "--metrics", "-w", "1",
             "--threads-http", str(max(4 * slots, 8)), "--no-webui", *extra]
    out = [Server(*flags, wait=False, ready_timeout=180.0) for _ in range(n)]
    try:
        for s in out:
            s.wait_ready()
    except BaseException:
        stop_instances(out)
        raise
    return out


def host_dir() -> str:
    """A new path for one fleet's --cache-host directory (on tmpfs; the instances create it)."""
    return os.path.join("/dev/shm", f"ringserve-fleet-{os.getpid()}-{next(_FLEETS)}")


def clear_host_dir(path: str) -> list[str]:
    """What the instances left of their --cache-host directory after they all stopped (nothing, if
    each removed its own files), removed."""
    if not path or not os.path.exists(path):
        return []
    left = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    shutil.rmtree(path, ignore_errors=True)
    return [f"--cache-host {path} left behind: {', '.join(left) or 'empty directories'}"]


def stop_instances(insts: list[Server]) -> list[str]:
    """Stop every instance; what any left behind (processes, /dev/shm)."""
    problems = []
    for s in insts:
        rc, left = s.finish()
        if left:
            problems.append(f"instance :{s.port} left {left}")
    return problems


class Gateway(Proc):
    """A front-end process on a free loopback port (frontends.testing.Proc:
    its own session, stopped with its tree)."""

    def __init__(self, front: Front, insts: list[Server]):
        self.front, self.dir, port = front, tempfile.mkdtemp(prefix=f"rs-{front.kind}-"), free_port()
        self.prom = 0
        if front.kind == "nginx":
            os.chmod(self.dir, 0o755)  # run as root, nginx's workers are another user
            cmd, ready = [NGINX, "-p", self.dir + "/", "-c", self._nginx_conf(port, insts), "-g", "daemon off;"], "/health"
        else:
            self.prom = free_port()
            cmd = [SMG, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *[s.base for s in insts],
                   "--prometheus-host", HOST, "--prometheus-port", str(self.prom), *SMG_BASE, *front.flags]
            ready = "/v1/models"  # 503 until a worker registered
        super().__init__(cmd, port, None, ready, 60.0, name=front.kind)
        if front.kind == "smg":  # and every worker, not only the first
            deadline = time.monotonic() + 60
            while len(self.healthy()) < len(insts):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"smg registered {self.healthy()} of {len(insts)}:\n{self.log_tail()}")
                time.sleep(0.1)

    def _nginx_conf(self, port: int, insts: list[Server]) -> str:
        """deploy/nginx.conf with its placeholders filled: one "server" line per instance."""
        with open(NGINX_CONF) as f:
            lines = f.read().replace("{{prefix}}", self.dir).replace("{{listen}}", f"{HOST}:{port}").splitlines()
        live = [i for i, ln in enumerate(lines) if re.search(r"\{\{instance_\d+\}\}", ln) and not ln.lstrip().startswith("#")]
        k, proto = live[0], lines[live[0]]
        lines = [ln for i, ln in enumerate(lines) if i not in live]
        lines[k:k] = [proto.replace("{{instance_1}}", f"{HOST}:{s.port}") for s in insts]
        path = os.path.join(self.dir, "nginx.conf")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def workers(self) -> list[dict]:
        """smg's worker registry (GET /workers): url, is_healthy, status, load."""
        code, body = get(self.url("/workers"), 2.0)
        return json.loads(body).get("workers", []) if code == 200 else []

    def healthy(self) -> list[str]:
        return [w["url"] for w in self.workers() if w.get("is_healthy")]

    def prom_metrics(self) -> dict[str, float]:
        return metrics(f"http://{HOST}:{self.prom}") if self.prom else {}

    def stop(self, timeout: float = 15.0) -> int:
        if self.front.kind == "smg" and self.proc.poll() is None:
            self.proc.kill()  # its SIGTERM drain keeps the listener 5 s for a load balancer: nothing to drain here
        rc = super().stop(timeout)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.cleanup()
        return rc


def tried_of(headers: dict) -> list[str]:
    """host:port of each instance a request went to, the one that answered
    last: nginx's X-Upstream (every instance tried, comma-separated), smg's
    x-smg-routed-worker-id (a URL); [""] if neither."""
    up = headers.get("x-upstream") or headers.get("x-smg-routed-worker-id") or ""
    return [u.strip().removeprefix("http://") for u in up.split(",")]


def upstream_of(headers: dict) -> str:
    return tried_of(headers)[-1]


def parse_chat(obj: dict):
    """One streamed chat chunk for loadgen: a token's text, the finish, or
    the usage chunk after it (the counts and ringserve's timings)."""
    if obj.get("usage"):
        u = obj["usage"]
        return False, "", {"n_out": u.get("completion_tokens"), "n_prompt": u.get("prompt_tokens", 0),
                           "timings": obj.get("timings") or {}}
    ch = (obj.get("choices") or [{}])[0]
    text = (ch.get("delta") or {}).get("content") or ""
    return bool(text), text, ({"n_out": None} if ch.get("finish_reason") else None)


def chat_wire(model_id: str, n_predict: int, tmpl, session: str = "") -> W.Wire:
    """The workloads over streaming /v1/chat/completions: the preamble as the
    system message, earlier turns as user/assistant pairs; greedy,
    ignore_eos, usage (and ringserve's timings) in the last chunk. With
    ``session``, each request names what it continues in x-smg-routing-key
    (what smg's --sticky-sessions pins on), as an application would: its
    conversation ("conversation": the first user message), or the document
    it asks about ("document": the system message)."""

    def messages(c: W.Conv, t: int, answer: str | None = None) -> list[dict]:
        out = [{"role": "system", "content": c.preamble}]
        for u, a in zip(c.users[:t], c.answers[:t]):
            out += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        out.append({"role": "user", "content": c.users[t]})
        return out + ([{"role": "assistant", "content": answer}] if answer is not None else [])

    def body(msgs: list[dict], i: int) -> dict:
        return {"model": model_id, "messages": msgs, "max_tokens": n_predict, "stream": True, "ignore_eos": True,
                "temperature": 0.0, "seed": 42, "stream_options": {"include_usage": True}}

    def key(msgs: list[dict], i: int) -> dict:
        return {"x-smg-routing-key": md5(msgs[0 if session == "document" else 1]["content"])[:16]}

    return W.Wire(loadgen.Api("/v1/chat/completions", body, parse_chat, key if session else None), messages,
                  lambda c, t, answer: tmpl.render(messages(c, t, answer), answer is None), upstream_of, True)


def chat_template(tok: W.Tokens):
    """The model's chat template as the instances pick it (no --chat-template)."""
    from frontends.text.chat import ChatTemplate

    info = tok.v.info()
    return ChatTemplate.pick("", tok.v.chat_template, info["bos_token"], info["eos_token"], info["arch"])


def counters(insts: list[Server]) -> list[dict]:
    """Each instance's evaluated and cached prompt tokens and accepted requests."""
    out = []
    for s in insts:
        m = metrics(s.base) if s.proc.poll() is None else {}
        out.append({"evaluated": m.get("llamacpp:prompt_tokens_total", 0.0),
                    "cached": m.get("llamacpp:prompt_tokens_cached_total", 0.0),
                    "requests": m.get("ringserve:requests_total", 0.0)})
    return out


def delta(after: list[dict], before: list[dict]) -> list[dict]:
    return [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]


@dataclass
class KillRun:
    """The kill scenario's raw facts (perf_counter seconds)."""

    t_kill: float = 0.0  # SIGKILL sent
    t_dead: float = 0.0  # every process of the instance gone (until then its sockets may still take connections)
    records: list[dict] = field(default_factory=list)
    routed_dead: list[float] = field(default_factory=list)  # when the gateway was seen sending to the dead one
    unhealthy_at: float = float("nan")  # smg: first poll with the dead worker out of rotation
    inflight_metrics: int = 0  # the doomed instance's requests processing + deferred, scraped just before


def kill_scenario(gw: Gateway, insts: list[Server], model_id: str, clients: int, n_predict: int, before_s: float,
                  after_s: float, timeout: float, on_done=None) -> KillRun:
    """Closed-loop unique chat prompts from ``clients`` threads; SIGKILL of
    the first instance's whole tree ``before_s`` in; ``after_s`` more.
    Which requests went where: each response's upstream header (nginx lists
    every instance it tried). When the gateway last sent to the dead one:
    nginx, the last request whose X-Upstream names it; smg, the last poll
    (every 0.1 s) at which its failure count against that worker
    (smg_worker_cb_outcomes_total{outcome="failure"}) rose, and the first at
    which /workers no longer called it healthy."""
    dead = f"{HOST}:{insts[0].port}"
    run, stop, lock = KillRun(), threading.Event(), threading.Lock()
    api = loadgen.Api("/v1/chat/completions", lambda p, i: {
        "model": model_id, "messages": [{"role": "user", "content": p}], "max_tokens": n_predict, "stream": True,
        "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}, parse_chat)
    prompts = loadgen.make_prompts(10_000)
    nxt = iter(range(len(prompts)))

    def client() -> None:
        while not stop.is_set():
            with lock:
                i = next(nxt)
            r = loadgen.stream_one(gw.port, api, prompts[i], i, timeout)
            rec = {"ok": r.ok, "error": r.error, "t_send": r.t_send, "t_end": time.perf_counter(),
                   "upstream": upstream_of(r.headers), "tried": tried_of(r.headers), "ttft": r.ttft, "n_out": r.n_out}
            with lock:
                run.records.append(rec)
            if on_done is not None:
                on_done(rec)

    def watch() -> None:
        key = f'smg_worker_cb_outcomes_total{{outcome="failure",worker="http://{dead}"}}'
        last = gw.prom_metrics().get(key, 0.0)  # before the kill: failures of an earlier run on this fleet
        while not stop.wait(0.1):
            if not run.t_kill:
                continue
            now = time.perf_counter()
            fails = gw.prom_metrics().get(key, 0.0)
            if fails > last:
                run.routed_dead.append(now)
                last = fails
            if run.unhealthy_at != run.unhealthy_at and f"http://{dead}" not in gw.healthy():
                run.unhealthy_at = now

    ths = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    if gw.front.kind == "smg":
        ths.append(threading.Thread(target=watch, daemon=True))
    for th in ths:
        th.start()
    time.sleep(before_s)
    m = metrics(insts[0].base)
    run.inflight_metrics = int(m.get("llamacpp:requests_processing", 0) + m.get("llamacpp:requests_deferred", 0))
    run.t_kill = time.perf_counter()
    procs.kill_all(insts[0].proc.pid)
    run.t_dead = time.perf_counter()
    time.sleep(after_s)
    stop.set()
    for th in ths:
        th.join(timeout + 5)
    if gw.front.kind == "nginx":
        run.routed_dead = [r["t_send"] for r in run.records if dead in r["tried"] and r["t_send"] >= run.t_kill]
    return run


def kill_figures(run: KillRun, dead: str, front: Front) -> dict:
    """Failed requests against the dead instance's in-flight ones at the
    kill, and how long the gateway kept sending to it."""
    recs, tk, td = run.records, run.t_kill, run.t_dead
    # open on the dead instance at the kill, or sent while it died (its sockets took them), or
    # failed without saying where (a request still queued in the instance has no response headers)
    inflight = [r for r in recs if r["t_send"] < td and r["t_end"] >= tk and (r["upstream"] == dead or not r["ok"])]
    failed = [r for r in recs if not r["ok"]]
    after = [r for r in recs if r["t_send"] >= td]
    last = max(run.routed_dead, default=tk) - tk
    return {"front": front.key, "label": front.label, "requests": len(recs), "failed": len(failed),
            "inflight_on_killed": len(inflight), "inflight_metrics": run.inflight_metrics,
            "failed_sent_after_kill": sum(not r["ok"] for r in after), "dying_s": td - tk,
            "after_kill": len(after), "after_kill_ok": sum(r["ok"] for r in after),
            "sent_to_dead_after_kill": len(run.routed_dead), "last_sent_to_dead_s": last,
            "unhealthy_after_s": run.unhealthy_at - tk, "health_interval_s": front.health_s,
            "errors": sorted({r["error"][:120] for r in failed})[:5]}


def model_id(inst: Server) -> str:
    """The id an instance reports in /v1/models (what smg registers and routes on)."""
    code, body = get(inst.url("/v1/models"), 10.0)
    if code != 200:
        raise RuntimeError(f"/v1/models answered {code}")
    return json.loads(body)["data"][0]["id"]
