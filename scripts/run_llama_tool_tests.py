"""Run llama.cpp's own tools/server/tests/unit/test_tool_call.py against
llama-server or ringserve with the locally available model.

Its presets download models from Hugging Face (tinyllama2 = stories260K);
nothing here reaches the network, so the preset is pointed at the default
model's GGUF (``--model PATH``; ``--smollm2``: SmolLM2-135M-Instruct) and the
cases that name a Hugging Face repository (the ``slow`` real-model ones) are
deselected. The test tree is copied under a temporary root that links
``models/`` to the vendored sources, so the tests' relative template paths
resolve.

    python scripts/run_llama_tool_tests.py --server ringserve|llama-server [-k EXPR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/src")
BIN = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server")
HERE = os.path.dirname(os.path.abspath(__file__))

CONFTEST = '''
import pytest
import utils
from utils import *

_orig = ServerPreset.tinyllama2


def _local():
    s = _orig()
    s.offline = False
    s.model_hf_repo = None
    s.model_hf_file = None
    s.model_file = {model!r}
    s.n_threads = 1
    return s


ServerPreset.tinyllama2 = staticmethod(_local)


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()
'''

WRAPPER = """#!/bin/sh
# llama-server's command line, run as ringserve from this worktree
PYTHONPATH={root} exec {python} -m frontends.process.cli "$@"
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", choices=("ringserve", "llama-server"), default="ringserve")
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("-k", default="")
    a = ap.parse_args()
    from frontends import testing

    model = testing.models.smollm2() if a.smollm2 else testing.models.default()
    root = tempfile.mkdtemp(prefix="llama-tool-tests-")
    try:
        os.symlink(os.path.join(SRC, "models"), os.path.join(root, "models"))
        tests = os.path.join(root, "tools", "server", "tests")
        os.makedirs(os.path.join(tests, "unit"))
        shutil.copy(os.path.join(SRC, "tools/server/tests/utils.py"), tests)
        shutil.copy(os.path.join(SRC, "tools/server/tests/unit/test_tool_call.py"), os.path.join(tests, "unit"))
        with open(os.path.join(tests, "wget.py"), "w") as f:  # utils.py imports it for downloads: none here
            f.write("def download(*a, **k):\n    raise RuntimeError('no downloads in these runs')\n")
        with open(os.path.join(tests, "conftest.py"), "w") as f:
            f.write(CONFTEST.format(model=model))
        env = dict(os.environ)
        if a.server == "ringserve":
            wrapper = os.path.join(root, "ringserve-as-llama-server")
            with open(wrapper, "w") as f:
                f.write(WRAPPER.format(root=os.path.dirname(HERE), python=sys.executable))
            os.chmod(wrapper, 0o755)
            env["LLAMA_SERVER_BIN_PATH"] = wrapper
        else:
            env["LLAMA_SERVER_BIN_PATH"] = BIN
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-rA",
               "unit/test_tool_call.py", *(["-k", a.k] if a.k else [])]
        return subprocess.call(cmd, cwd=tests, env=env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
