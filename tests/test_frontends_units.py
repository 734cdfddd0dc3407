"""Unit tests of the worker-side pieces that need no server."""
from __future__ import annotations

import pytest

from engine.config import Config
from engine.gguf import context_length
from frontends.text.chat import CHATML, GEMMA, ChatTemplate, normalize
from frontends.text.detok import Detok
from frontends.text.errors import ApiError
from frontends.text.params import logit_bias, plan, prompts


@pytest.fixture(scope="module")
def vocab():
    from frontends.text.tokenizer import Vocab

    return Vocab(Config().model_path())


class _Ctx:
    def __init__(self, vocab):
        self.cfg, self.vocab, self.n_slots, self.spec_types = Config(), vocab, 4, ()


# ------------------------------------------------------------------ detokenizer
def test_utf8_split_across_tokens():
    d = Detok()
    data = "añ日本🙂x".encode()
    out = [d.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + d.finish() == "añ日本🙂x"
    assert all(s == "" or s.isprintable() for s in out)  # never half a character
    assert out[1] == "" and out[2] == "ñ"  # held until the second byte came


def test_utf8_invalid_and_unfinished():
    d = Detok()
    assert d.feed(b"a\xff") == "a\ufffd"
    assert d.feed(b"\xe6\x97") == ""
    assert d.finish() == "\ufffd"


def test_stop_string_full_and_partial_holdback():
    d = Detok(["</end>", "STOP"])
    assert d.feed(b"hello <") == "hello "  # "<" may start "</end>": held
    assert d.pending == "<"
    assert d.feed(b"/en") == ""
    assert d.feed(b"d> tail") == ""
    assert d.word == "</end>" and d.text == "hello "


def test_stop_partial_that_does_not_complete_is_released():
    d = Detok(["world"])
    assert d.feed(b"a wor") == "a "
    assert d.feed(b"m") == "worm"
    assert d.feed(b" wo") == " "
    assert d.finish() == "wo" and d.word is None and d.text == "a worm wo"


def test_earliest_stop_wins_and_multibyte_stop():
    d = Detok(["cd", "b"])
    d.feed(b"abcd")
    assert d.word == "b" and d.text == "a"
    d = Detok(["日本"])
    s = "x日本y".encode()
    for i in range(len(s)):
        d.feed(s[i : i + 1])
    assert d.word == "日本" and d.text == "x"


# ------------------------------------------------------------------ params
def test_prompt_forms(vocab):
    one = prompts(vocab, "Hello")
    assert len(one) == 1 and one[0][0] == vocab.bos
    assert prompts(vocab, [9259, 1902]) == [[9259, 1902]]
    mixed = prompts(vocab, [9259, " world"])
    assert mixed[0][0] == 9259 and len(mixed) == 1 and vocab.bos not in mixed[0]
    multi = prompts(vocab, ["a", "b", [9259]])
    assert len(multi) == 3
    for bad in (None, 5, [1.5], [[True]], {"x": 1}, [], [-1], [10**9]):
        with pytest.raises(ApiError) as e:
            prompts(vocab, bad)
        assert e.value.code == 400


def test_plan_validation(vocab):
    ctx = _Ctx(vocab)
    ids = [[2, 9259]]
    pl = plan(ctx, {"n_predict": 5, "temperature": 0, "stop": "x", "seed": -1, "n_probs": 50}, ids)
    assert pl.params["n_predict"] == 5 and pl.stops == ["x"] and pl.params["seed"] == 0xFFFFFFFF
    assert pl.params["n_probs"] == 20  # clamped to what the channel carries
    assert plan(ctx, {"max_tokens": 7}, ids).params["n_predict"] == 7
    assert plan(ctx, {"n_predict": None}, ids).params["n_predict"] == -1
    # llama-server's refusals: wrong types (get<T> throws), hard limits (set_hard_limits); soft
    # limits clamp, integers truncate and wrap (tests/test_parity_params.py)
    for body in ({"n_predict": "5"}, {"n_predict": -2}, {"temperature": "hot"}, {"top_p": [2]}, {"stop": [1]},
                 {"stream": "yes"}, {"seed": "1"}, {"repeat_last_n": -1}, {"n_probs": {}}, {"n_predict": -2.5},
                 {"grammar": "x", "json_schema": {}}, {"n_discard": -1}, {"min_keep": -1}):
        with pytest.raises(ApiError) as e:
            plan(ctx, body, ids)
        assert e.value.code == 400, body


def test_logit_bias_forms(vocab):
    assert logit_bias({"logit_bias": [[15, 1.0], [16, False]]}, vocab) == [(15, 1.0), (16, float("-inf"))]
    assert logit_bias({"logit_bias": {"15": -2}}, vocab) == [(15, -2.0)]
    assert logit_bias({"logit_bias": {"Hello": 1}}, vocab)[0][1] == 1.0
    # as llama-server's handler: bad entries are skipped (they were a 400 for the whole request), a value that is
    # neither an array nor an object is ignored, an object key is an id only where strtol reads it whole
    bad = [[10 ** 9, 1], [-1, 1], [15, True], [15, "x"], [15], [15, 1, 2], [1.5, 1], 15]
    assert logit_bias({"logit_bias": bad + [[16, 2]]}, vocab) == [(16, 2.0)]
    for v in (False, 5, "x"):
        assert logit_bias({"logit_bias": v}, vocab) == []
    assert logit_bias({"logit_bias": {" 15": 1, "-1": 1, "99999999999": 1}}, vocab) == [(15, 1.0)]
    assert logit_bias({"logit_bias": {"1_5": 1}}, vocab) == [(t, 1.0) for t in vocab.tokenize("1_5", False, False)]


def test_json_schema_becomes_grammar(vocab):
    pl = plan(_Ctx(vocab), {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}, [[2]])
    assert b"root" in pl.grammar


# ------------------------------------------------------------------ chat
def test_chat_templates():
    t = ChatTemplate.pick("", "", "<bos>", "<eos>", "llama")
    assert t.source == CHATML
    assert ChatTemplate.pick("", "", "<bos>", "<eos>", "gemma3").source == GEMMA
    assert ChatTemplate.pick("", "{{ 'x' }}", "<bos>", "<eos>", "gemma3").source == "{{ 'x' }}"
    out = t.render(normalize([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]))
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    g = ChatTemplate.pick("", "", "<bos>", "<eos>", "gemma3")
    out = g.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert out == "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"  # BOS stripped
    with pytest.raises(ApiError) as e:
        g.render([{"role": "assistant", "content": "x"}])
    assert e.value.code == 400 and "alternate" in e.value.message
    for bad in (None, [], [{"content": "x"}], [{"role": "user", "content": 5}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]):
        with pytest.raises(ApiError):
            normalize(bad)


def test_developer_is_system_for_every_template_but_gpt_oss():
    """OpenAI's newer clients send ``developer``; llama-server renders it as
    ``system`` (map_developer_role_to_system) unless the template is gpt-oss's."""
    dev = [{"role": "developer", "content": "be nice"}, {"role": "user", "content": "hi"}]
    sys_ = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
    for arch in ("llama", "gemma3"):  # ChatML; Gemma refuses roles that do not alternate
        t = ChatTemplate.pick("", "", "<bos>", "<eos>", arch)
        assert t.render(normalize(dev)) == t.render(normalize(sys_))
    oss = ChatTemplate("{% for m in messages %}<|start|>{{ m.role }}<|channel|>{{ m.content }}{% endfor %}",
                       "<bos>", "<eos>")
    assert oss.render(dev).startswith("<|start|>developer<|channel|>be nice")


# ------------------------------------------------------------------ gguf
def test_gguf_context_length():
    assert context_length(Config().model_path()) == 32768
