"""The suite's schedule under pytest-xdist: the files that mostly wait run
side by side first, then every other file runs with nothing beside it.

Why two phases: llama.cpp's threads spin while they wait, so a real engine
at ``-t 2`` on a 2-core machine slows down by up to 10x beside any other
busy process, and timing assertions of the model tests (slow readers,
preemption, step budgets) would flake. The files in ``SHARED`` run no
engine, the fake one, or real ones at ``-t 1``, and most of them wait most
of the time (fake engines' token pauses, restarts, grace periods, gateways'
health checks). One file at a time they left the two cores idle about half
of the time; ``-n`` at a time they keep them busy. The rest run one file at
a time on one worker while the others have exited.

Invariant: an ``alone`` file starts only when no other worker holds an
unfinished test, and nothing is sent to another worker until the run ends.
A file is one unit (module fixtures: its servers start once). A file not
listed is alone: a new file is safe by default.

xdist keeps the last test it was sent pending on a worker until more work or
the shutdown arrives (it needs the next item to tear fixtures down), so the
worker chosen for the alone phase holds its last shared test until the
others have finished theirs, and the shared workers are shut down, not
starved, once the shared queue is empty.
"""
from __future__ import annotations

import os
from collections import OrderedDict

from xdist.scheduler import LoadFileScheduling

# file -> why it may run beside the other shared files: no engine, the fake one, or real ones at -t 1 (one
# thread never waits at a barrier, so a neighbour costs it its share of the cores, not a spin). Longest
# first (measured, one file at a time), so the phase ends with short files on every worker. Kept out:
# wake-ups asserted within 10-100 ms (channels, ring, hangup, frontends_errors), a browser's paints and
# load times (webui: with every core busy it paints several tokens at once, seen in CI), memory measured
# (engine_fork's PSS, memory, memtrace, leak), /dev/shm compared whole (crash), -t 2 engines (the rest).
SHARED = OrderedDict([
    ("test_toolfmt_lazy.py", "an engine at -t 1: grammars and parsed calls, not time"),
    ("test_shift_real.py", "ringserve and llama-server at -t 1, side by side"),
    ("test_frontends_proc.py", "fake engine: restarts, crashes, a plain gunicorn config"),
    ("test_smg.py", "fake engines behind the smg binary: health checks, a kill, load figures"),
    ("test_lifecycle.py", "fake engine: SIGTERM drains, SIGHUP, TTIN/TTOU, gunicorn config"),
    ("test_think_grammar.py", "an engine at -t 1: what a grammar lets through, not time"),
    ("test_smollm2.py", "ringserve and llama-server on SmolLM2 at -t 1"),
    ("test_sse_ping.py", "fake engine: 3.5 s SSE ping intervals"),
    ("test_nginx.py", "fake engines behind nginx; its TTFT check interleaves direct and proxied"),
    ("test_hosttier.py", "engines at -t 1"),
    ("test_faults_stuck.py", "fake engine: a wedged engine's timeouts"),
    ("test_kvevents_real.py", "an engine at -t 1; checks events, not time"),
    ("test_llama_params.py", "engines at -t 1; failed starts"),
    ("test_sleep_engine.py", "SmolLM2 at -t 1: idle waits for sleep and wake"),
    ("test_agents_real.py", "an engine at -t 1: the OpenAI and Anthropic clients' shapes"),
    ("test_toolfmt.py", "no engine"),
    ("test_kvevents.py", "no engine"),
    ("test_frontends_api.py", "fake engine"),
    ("test_toolfmt_chat.py", "fake engine"),
    ("test_crashdump.py", "an engine at -t 1 that dies while loading"),
    ("test_reasoning_tools.py", "fake engine"),
    ("test_cli.py", "no engine"),
    ("test_cors_proxy.py", "fake engine"),
    ("test_frontends_agents.py", "fake engine"),
    ("test_prefix.py", "no engine: the prefix cache's tree on fake streams"),
    ("test_parity_api.py", "fake engine"),
    ("test_render.py", "fake engine"),
    ("test_frontends_units.py", "no engine"),
    ("test_metrics_window.py", "no engine"),
    ("test_tools_units.py", "no engine"),
    ("test_spec_replay.py", "no engine"),
    ("test_parity_params.py", "no engine"),
    ("test_testing.py", "no engine"),
    ("test_frontends_auth.py", "no engine"),
    ("test_spec_ngram.py", "no engine"),
    ("test_spec_cost.py", "no engine"),
    ("test_lease_end.py", "no engine"),
    ("test_params.py", "no engine"),
    ("test_budget.py", "no engine"),
    ("test_prefix_policy.py", "no engine"),
])


def shared(scope: str) -> bool:
    """Whether a file (a nodeid's file part, ``tests/test_x.py``) is in SHARED."""
    return os.path.basename(scope) in SHARED


class Phases(LoadFileScheduling):
    """LoadFileScheduling with two queues: ``workqueue`` (shared files, any
    worker) and ``alone`` (the rest, one worker, nothing beside it)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.alone: OrderedDict[str, dict[str, bool]] = OrderedDict()
        self.solo = None  # the worker that runs the alone phase; None until chosen, or after it died

    @property
    def tests_finished(self) -> bool:
        return not self.alone and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.alone) or super().has_pending

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            order = list(SHARED)
            for scope in sorted((s for s in units if shared(s)), key=lambda s: order.index(os.path.basename(s))):
                self.workqueue[scope] = units[scope]
            self.alone.update((scope, unit) for scope, unit in units.items() if not shared(scope))
        for node in self.nodes:
            self._reschedule(node)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        self._start_alone()

    def remove_node(self, node):
        """A worker that finished, or crashed: a crashed worker's unfinished
        files go back to the front of their own queue, less the test that
        crashed (xdist reports it as failed)."""
        if node is self.solo:
            self.solo = None
        crash = None
        for scope, unit in self.assigned_work.pop(node).items():
            left = [nodeid for nodeid, done in unit.items() if not done]
            if not left:
                continue
            crash = crash or left[0]
            unit[left[0]] = True
            if len(left) == 1:
                continue
            queue = self.workqueue if shared(scope) else self.alone
            queue[scope] = unit
            queue.move_to_end(scope, last=False)
        for other in self.nodes:
            self._reschedule(other)
        self._start_alone()
        return crash

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        # two files or more queued on a worker: xdist holds a worker's last test until more arrives
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
        if self.workqueue:
            return
        if self.solo is None:
            self.solo = node
        if node is not self.solo or not self.alone:
            node.shutdown()  # runs what it holds, then exits
            return
        self._start_alone()

    def _start_alone(self) -> None:
        """Feed the solo worker once no other worker holds a test (the invariant)."""
        node = self.solo
        if node is None or self.workqueue or node.shutting_down:
            return
        if any(self._pending_of(w) for n, w in self.assigned_work.items() if n is not node):
            return
        while self.alone and self._pending_of(self.assigned_work[node]) <= 2:
            scope, unit = self.alone.popitem(last=False)
            self.assigned_work[node][scope] = unit
            col = self.registered_collections[node]
            node.send_runtest_some([col.index(nodeid) for nodeid, done in unit.items() if not done])
        if not self.alone:
            node.shutdown()
