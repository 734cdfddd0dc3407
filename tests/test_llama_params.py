"""The flags that reach llama.cpp's model and context params, with the real
model: what Model hands llama.cpp (Model.params, the engine's "llama params"
log line) and what the context then holds (its thread counts, the KV cache
lines llama.cpp logs)."""
from __future__ import annotations

import pytest

from engine.config import Config
from engine.setting import KV_TYPES
from engine.llamaparams import model_params, model_params_dict
from engine.model import Model
from engine.vocab import ModelError

BASE = dict(parallel=2, ctx_size=1024, batch_size=256, ubatch_size=256, threads=1)


def test_context_flags_reach_llama():
    """-t/-tb reach n_threads/n_threads_batch; -ctk/-ctv reach type_k/type_v
    (llama.cpp's own KV lines say q8_0) and the KV size follows the type."""
    with Model(Config(**BASE, threads_batch=2, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")) as m:
        p = m.params
        assert (p["n_threads"], p["n_threads_batch"], p["type_k"], p["type_v"]) == (1, 2, "q8_0", "q8_0")
        assert m.kv_caches and all((c["type_k"], c["type_v"]) == ("q8_0", "q8_0") for c in m.kv_caches)
        q8 = m.kv_bytes
    with Model(Config(**BASE, flash_attn="on")) as m:
        assert (m.params["n_threads_batch"], m.params["type_k"], m.params["type_v"]) == (1, "f16", "f16")
        assert all(c["type_k"] == "f16" for c in m.kv_caches)
        f16 = m.kv_bytes
    assert q8 / f16 == pytest.approx(KV_TYPES["q8_0"][1] / 2, rel=0.01), (q8, f16)  # 34/64: 47% less


def test_quantized_v_without_flash_attention():
    """llama.cpp's rule: -fa off refuses a quantized V (its error in ours);
    -fa auto turns flash attention on for it."""
    with pytest.raises(ModelError, match="quantized V cache requires flash_attn"):
        Model(Config(**BASE, cache_type_v="q8_0", flash_attn="off"))
    with Model(Config(**BASE, cache_type_v="q4_0", flash_attn="auto")) as m:
        assert m.flash_attn_on and m.params["type_v"] == "q4_0"
        assert all(c["type_v"] == "q4_0" for c in m.kv_caches)


def test_model_flags_reach_llama():
    """-dev none, -sm, -mg, --no-mmap/--mlock (as a load mode), --numa: the
    model loads with them (CPU: nothing to offload) and they are what
    llama_model_params held."""
    cfg = Config(**BASE, device="none", split_mode="none", main_gpu=0, mmap=False, mlock=True, numa="distribute")
    with Model(cfg) as m:
        p = m.params
        assert (p["devices"], p["split_mode"], p["main_gpu"], p["load_mode"], p["numa"]) == (
            "none", "none", 0, "mlock", "distribute")
    for kw, want in ((dict(mmap=False), "none"), (dict(mlock=True), "mmap+mlock"), (dict(load_mode="dio"), "dio"),
                     (dict(load_mode="mmap", mlock=True), "mmap"), ({}, "auto")):
        assert model_params_dict(model_params(Config(**kw))[0])["load_mode"] == want, kw
    mp, keep = model_params(Config(tensor_split=[3.0, 1.0], split_mode="row", main_gpu=1))
    d = model_params_dict(mp)
    assert (d["tensor_split"], d["split_mode"], d["main_gpu"], d["devices"]) == ([3.0, 1.0], "row", 1, "all")


def test_unknown_device_fails_at_start():
    """common/arg.cpp parse_device_list: a name that is no (non-CPU) device
    of this build is an error before anything loads."""
    for name in ("Nope0", "CPU"):
        with pytest.raises(ModelError, match=f"invalid device: {name}"):
            Model(Config(**BASE, device=name))
    with pytest.raises(ModelError, match="input configs, but system only has"):
        model_params(Config(tensor_split=[1.0] * 64))


def test_flags_reach_the_engine_from_the_command_line():
    """ringserve's argv to the engine's llama params (RINGSERVE_CONFIG), as
    the engine logs them; an unknown device stops the server with 1 and the
    reason, as llama-server stops on it."""
    from concurrent.futures import ThreadPoolExecutor

    from frontends import testing as S

    with ThreadPoolExecutor(1) as ex:  # the refused start runs beside the good one
        refused = ex.submit(S.Server.failed_start, "-c", "512", "-np", "1", "-t", "1", "-w", "1", "-dev", "Nope0")
        _flags_in_the_engine_log(S)
        rc, left, log = refused.result()
    assert rc == 1 and left == [], log[-3000:]
    assert "invalid device: Nope0" in log, log[-3000:]


def _flags_in_the_engine_log(S) -> None:
    """A server with the flags: the engine's "llama params" line and KV line hold them."""
    with S.Server("-c", "512", "-np", "1", "-t", "1", "-tb", "2", "-w", "1", "--threads-http", "4", "-fa", "on",
                  "-ctk", "q8_0", "-ctv", "q8_0", "-dev", "none", "--no-mmap", "--numa", "distribute") as s:
        line = next((x for x in s.log().splitlines() if "llama params:" in x), "")
        for want in ("numa=distribute", "load_mode=none", "devices=none", "n_threads=1", "n_threads_batch=2",
                     "type_k=q8_0", "type_v=q8_0", "flash_attn=on"):
            assert want in line.split(), (want, line)
        assert "(K q8_0, V q8_0)" in s.log()
