"""POST /infill: fill-in-the-middle with the model's FIM tokens.

The prompt is built as llama-server's format_prompt_infill (server-common.cpp)
builds it: the repo-level pattern ``[FIM_REP]myproject\\n`` then, per
``input_extra`` chunk, ``[FIM_SEP]filename\\n`` (or a ``--- snippet ---``
separator when the vocabulary has no FIM_SEP) and its text, then
``[FIM_SEP]filename\\n``; then ``[BOS]?[FIM_PRE]prefix prompt [FIM_SUF]suffix
[FIM_MID]``. The prefix keeps its last 3/4 of a batch, the suffix its first
``n_batch/4 - 2 - len(prompt)`` tokens, the extra context what the slot has
left past a batch and twice n_predict. The rest (sampling, stops, streaming,
the answer's shape) is /completion's.

A model without FIM_PRE, FIM_SUF or FIM_MID gets llama-server's 501 (its
not_supported_error), checked before the body, as llama-server does.
"""
from __future__ import annotations

from dataclasses import dataclass

import falcon
import llama_cpp as L

from frontends.http.ctx import Ctx, read_json
from frontends.text.errors import ApiError, bad
from frontends.text.fields import get_int

from .native import Completion

SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's k_chunk_prefix_str


@dataclass(frozen=True)
class Fim:
    """The vocabulary's FIM token ids (-1: absent, LLAMA_TOKEN_NULL)."""

    pre: int
    suf: int
    mid: int
    rep: int = -1
    sep: int = -1

    @classmethod
    def of(cls, vocab) -> "Fim":
        v = vocab.core.vocab
        return cls(L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v),
                   L.llama_vocab_fim_rep(v), L.llama_vocab_fim_sep(v))

    def missing(self) -> str:
        """llama-server's reason text ("" when infill is possible)."""
        out = ""
        for tok, what in ((self.pre, "prefix"), (self.suf, "suffix"), (self.mid, "middle")):
            if tok < 0:
                out += f"{what} token is missing. "
        return out


def _mixed(vocab, v, field: str) -> list[int]:
    """llama-server's tokenize_mixed without special tokens: a string, token
    ids, or ids mixed with strings."""
    if isinstance(v, str):
        return vocab.tokenize(v, False, False)
    if isinstance(v, list):
        out: list[int] = []
        for e in v:
            if isinstance(e, str):
                out += vocab.tokenize(e, False, False)
            elif isinstance(e, int) and not isinstance(e, bool) and vocab.valid(e):
                out.append(e)
            else:
                raise bad(f"Field '{field}': expected a string, or token ids and strings")
        return out
    raise bad(f"Field '{field}': expected a string")


def extra_chunks(body: dict) -> list[dict]:
    """``input_extra`` validated: [{"text": str, "filename"?: str}, ...]."""
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise bad('"input_extra" must be an array of {"filename": string, "text": string}')
    for c in extra:
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise bad('extra_context chunk must contain a "text" field with a string value')
        if "filename" in c and not isinstance(c["filename"], str):
            raise bad("extra_context chunk's \"filename\" field must be a string")
    return extra


def infill_prompt(vocab, fim: Fim, prefix, suffix, extra: list[dict], prompt: list[int],
                  n_batch: int, n_predict: int, n_ctx: int, add_bos: bool, bos: int) -> list[int]:
    """The token ids llama-server's format_prompt_infill builds (spm_infill off)."""
    tok = lambda s: vocab.tokenize(s, False, False)  # noqa: E731
    pre, suf = _mixed(vocab, prefix, "input_prefix"), _mixed(vocab, suffix, "input_suffix")
    extra_ids: list[int] = []
    if fim.rep >= 0:
        extra_ids += [fim.rep] + tok("myproject\n")
    for c in extra:
        if fim.sep >= 0:
            extra_ids += [fim.sep] + tok(c.get("filename", "tmp") + "\n")
        else:
            extra_ids += tok(SNIPPET)
        extra_ids += tok(c["text"])
    if fim.sep >= 0:
        extra_ids += [fim.sep] + tok("filename\n")
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    pre = [fim.pre] + pre[len(pre) - n_pre:] + list(prompt)
    suf = [fim.suf] + suf[:n_suf]
    head = [bos] if add_bos else []
    return (extra_ids[len(extra_ids) - n_extra:] if n_extra else []) + head + pre + suf + [fim.mid]


class Infill(Completion):
    """POST /infill (a /completion whose prompt is built from FIM parts)."""

    def __init__(self, ctx: Ctx):
        super().__init__(ctx)
        self.fim = Fim.of(ctx.vocab)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        why = self.fim.missing()
        if why:
            raise ApiError(501, f"Infill is not supported by this model: {why}")
        body = read_json(req, ctx.cfg.max_body)
        p = body.get("prompt")
        if p is not None and not isinstance(p, str):
            raise bad('"prompt" must be a string')
        for k in ("input_prefix", "input_suffix"):
            if k not in body:
                raise bad(f'"{k}" is required')
        extra = extra_chunks(body)
        n_predict = get_int(body, ("n_predict", "max_tokens"), ctx.cfg.n_predict)
        v = ctx.vocab
        ids = infill_prompt(v, self.fim, body["input_prefix"] or "", body["input_suffix"] or "", extra,
                            v.tokenize(p or "", False, True), ctx.cfg.batch_size, n_predict, ctx.n_ctx_slot,
                            v.add_bos, v.bos)
        self.complete(req, resp, body, [ids])
