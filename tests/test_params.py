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


def test_samplers_and_dry_breakers_reach_the_engine_and_the_settings():
    """The two structured sampling fields, read as llama-server's handlers
    read them, travel in ipc/chain.py's header (absent at the defaults) and
    show in generation_settings; dry_base below 1 is the default (not a 400)."""
    import pytest
    from types import SimpleNamespace

    from frontends.text.errors import ApiError
    from frontends.text.params import plan
    from ipc import chain

    ctx = SimpleNamespace(cfg=Config(), n_slots=2, vocab=None, spec_types=())
    pl = plan(ctx, {}, [[1]])
    assert pl.chain == b""
    assert pl.settings["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                                       "xtc", "temperature"]
    assert pl.settings["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]
    pl = plan(ctx, {"samplers": ["Top-K", "nucleus", "bogus", "temp"], "dry_sequence_breakers": ["x"],
                    "dry_base": 0.5, "dry_multiplier": 0.8, "mirostat": 7}, [[1]])
    assert pl.settings["samplers"] == ["top_k", "top_p", "temperature"]
    assert pl.settings["dry_sequence_breakers"] == ["x"]
    assert (pl.params["dry_base"], pl.params["dry_multiplier"], pl.params["mirostat"]) == (1.75, 0.8, 2)
    assert chain.unpack(pl.chain + b"root") == (("kpt", (b"x",)), b"root")
    long = plan(ctx, {"dry_sequence_breakers": ["y" * 50, "é" * 30]}, [[1]])  # cut to 40 bytes, as llama.cpp
    assert chain.unpack(long.chain)[0][1] == (b"y" * 40, ("é" * 20).encode())
    for big in ({"samplers": "k" * 70000}, {"dry_sequence_breakers": ["z"] * 20000}):  # a 400, not a 500
        with pytest.raises(ApiError, match="longer than"):
            plan(ctx, big, [[1]])
    assert plan(ctx, {"samplers": "kq?t"}, [[1]]).order == "kt"  # unknown chars skipped
    assert plan(ctx, {"samplers": 5}, [[1]]).order == chain.ORDER  # another type: the default
    for bad in ([], "x", [1], ["a", 2]):
        with pytest.raises(ApiError, match="dry_sequence_breakers must be a non-empty array of strings"):
            plan(ctx, {"dry_sequence_breakers": bad}, [[1]])
    with pytest.raises(ApiError, match="samplers"):
        plan(ctx, {"samplers": ["top_k", 3]}, [[1]])
    with pytest.raises(ValueError, match="malformed sampler chain header"):
        chain.unpack(chain.MAGIC + b"\x03kq")


def test_server_wide_sampling_flags_are_the_defaults():
    """llama-server's sampling flags (refused before: exit 2) set the
    defaults a request's fields override."""
    from types import SimpleNamespace

    from frontends.process.cli import parse
    from frontends.text.params import plan
    from ipc import chain

    cfg, _ = parse(["--dry-multiplier", "0.5", "--repeat-penalty", "1.1", "--samplers", "top_k;temp",
                    "--dry-sequence-breaker", "none", "--mirostat", "2", "--ignore-eos"])
    ctx = SimpleNamespace(cfg=cfg, n_slots=2, vocab=SimpleNamespace(core=SimpleNamespace(eog_ids=[1])),
                          spec_types=())
    pl = plan(ctx, {}, [[1]])
    assert (pl.params["dry_multiplier"], pl.params["repeat_penalty"], pl.params["mirostat"]) == (0.5, 1.1, 2)
    assert pl.params["ignore_eos"] == 1
    assert (pl.settings["samplers"], pl.settings["dry_sequence_breakers"]) == (["top_k", "temperature"], [])
    assert chain.unpack(pl.chain) == (("kt", ()), b"")
    pl = plan(ctx, {"samplers": "edskypmxt", "dry_sequence_breakers": ["\n", ":", "\"", "*"], "dry_multiplier": 0},
              [[1]])
    assert pl.chain == b"" and pl.params["dry_multiplier"] == 0.0
    assert parse(["--sampler-seq", "kt"])[0].samplers == "kt"
    # as common/arg.cpp: --samplers reads names (an unknown one skipped), --sampler-seq chars, the last one wins
    assert parse(["--samplers", "top_k;typo"])[0].samplers == "k"
    assert parse(["--samplers", "top_k", "--sampler-seq", "dry"])[0].samplers == "dy"
    assert (parse(["--dry-base", "0.5"])[0].dry_base, Config().dry_penalty_last_n) == (1.75, 64)  # llama-server's
