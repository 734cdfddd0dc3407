"""ipc/params.py: the one table of request parameters, and what derives from it."""
from __future__ import annotations

from engine.config import Config
from frontends.api.openapi import SAMPLING
from ipc.layout import PARAMS
from ipc.params import PARAMS_TABLE, RECORD, defaults

# The hand-written PARAMS record of layout version 1: the table must keep it byte for byte
V1 = [("n_prompt", "<u4"), ("n_predict", "<i4"), ("temperature", "<f4"), ("top_k", "<i4"), ("top_p", "<f4"),
      ("min_p", "<f4"), ("typical_p", "<f4"), ("repeat_penalty", "<f4"), ("repeat_last_n", "<i4"),
      ("presence_penalty", "<f4"), ("frequency_penalty", "<f4"), ("seed", "<u4"), ("n_probs", "<i4"),
      ("id_slot", "<i4"), ("cache_prompt", "|u1"), ("ignore_eos", "|u1"), ("post_sampling_probs", "|u1"),
      ("_pad", "|u1"), ("n_grammar", "<u4"), ("n_bias", "<u4"), ("_pad2", "<u4", (15,))]


def test_record_layout_is_version_1():
    """Byte for byte the hand-written record while the table has its rows;
    a new row moves later fields (all processes share the code) but every
    field keeps its type and the record stays whole lines."""
    v1 = dict((d[0], d[1]) for d in V1 if not d[0].startswith("_"))
    if {p.name for p in RECORD} | {"n_prompt", "n_grammar", "n_bias"} == set(v1):
        assert PARAMS.descr == V1
    assert all(PARAMS.fields[k][0].str == v for k, v in v1.items())
    assert PARAMS.itemsize % 64 == 0


def test_every_row_reaches_record_defaults_schema_and_settings():
    from frontends.text.params import plan
    from types import SimpleNamespace

    cfg = Config(temp=0.3, top_k=7, seed=-1, n_predict=5, cache_prompt=False)
    d = defaults(cfg)
    assert set(d) == {p.name for p in RECORD} == set(PARAMS.names) - {"n_prompt", "n_grammar", "n_bias", "_pad", "_pad2"}
    assert (d["temperature"], d["top_k"], d["seed"], d["n_predict"], d["cache_prompt"]) == (0.3, 7, 0xFFFFFFFF, 5, 0)
    assert cfg.sampling() == d
    for p in PARAMS_TABLE:
        if p.field or p.check:
            assert all(k in SAMPLING for k in (p.name,) + p.aliases), p.name
    ctx = SimpleNamespace(cfg=cfg, n_slots=2, vocab=None, spec_types=())
    gs = plan(ctx, {}, [[1]]).settings
    assert all((p.name in gs) == (p.shown and not p.scope) for p in PARAMS_TABLE)  # hidden and other endpoints' rows stay out
    assert (gs["temperature"], gs["cache_prompt"], gs["top_n_sigma"]) == (0.3, False, -1.0)
