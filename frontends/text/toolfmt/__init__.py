"""Native tool-call formats: each template family's own call syntax, chosen
from the template as llama-server's common/chat.cpp chooses it.

One module per family, each a ``Format`` (core.py: ``parse(text, final)``,
monotone in the text, and the ``Stream`` that turns parses into OpenAI
deltas): ``hermes`` (Hermes 2 Pro / 3, Qwen 2.5 / 3, QwQ), ``llama3``
(Llama 3.x), ``mistral`` (Mistral Nemo), ``gptoss`` (harmony channels),
``deepseek`` (DeepSeek R1), ``qwen3coder`` (Qwen3-Coder XML). ``detect``
picks one from the template source in chat.cpp's order (its specialized
templates first: gpt-oss, Qwen3-Coder; then the families its differential
autoparser learns); a template none fits, or one that cannot show a tool
call, keeps the generic JSON form (frontends/text/tools.py, toolparse.py).
``history.py`` puts the conversation into the jinja context as llama-server
does (tools, tool calls, tool results), so the template renders it.

Imports: frontends/text's lower modules (errors, toolparse) only.
"""
from __future__ import annotations

import functools

from . import history
from .core import Call, Format, Msg, Stream
from .deepseek import DeepSeekR1
from .gptoss import GptOss
from .hermes import Hermes
from .llama3 import Llama3
from .mistral import MistralNemo
from .qwen3coder import Qwen3Coder

FAMILIES = (GptOss, Qwen3Coder, MistralNemo, DeepSeekR1, Hermes, Llama3)  # detection order
THINK = ("<think>", "</think>")

__all__ = ["Call", "Format", "Msg", "Stream", "FAMILIES", "detect", "pick", "think_prefix"]


def detect(src: str) -> type[Format] | None:
    """The family of a template source, None for the generic form."""
    for fam in FAMILIES:
        if fam.detect(src):
            return fam
    return None


def _probe(tmpl, msgs: list[dict]) -> str:
    try:
        return tmpl.render(msgs, False, {})
    except Exception:  # noqa: BLE001 -- a template that refuses the probe shows nothing
        return ""


def think_markers(tmpl) -> tuple[str, str] | None:
    """The template's reasoning markers, as llama-server's autoparser learns
    them: an assistant turn rendered with reasoning_content shows the start
    tag (and the whitespace after it) before the thoughts and the end tag
    (and the whitespace after it) before the content. A template that drops
    the thoughts but names ``<think>`` gets the bare tags."""
    out = _probe(tmpl, [{"role": "user", "content": "rs_u"},
                        {"role": "assistant", "content": "rs_content", "reasoning_content": "rs_thoughts"}])
    r, c = out.find("rs_thoughts"), out.find("rs_content")
    if 0 <= r < c:
        s = out.rfind("<", 0, r)
        e = out.find("<", r + len("rs_thoughts"))
        if 0 <= s and 0 <= e < c and out[s + 1] != "|" and out[e + 1] == "/":
            return out[s:r].rstrip(" ") if out[s:r].strip() else out[s:r], out[e:c]
    return THINK if THINK[0] in tmpl.source and THINK[1] in tmpl.source else None


@functools.lru_cache(maxsize=8)
def pick(tmpl) -> Format | None:
    """The template's native format (None: the generic JSON form): the
    family its source names, kept only where the template shows tool calls."""
    fam = detect(getattr(tmpl, "source", "") or "")
    if fam is None or not history.shows_calls(tmpl):
        return None
    fmt = fam(tmpl.source)
    if fam is not GptOss:
        fmt.think = think_markers(tmpl)
    return fmt


def think_prefix(fmt: Format, prompt: str) -> str:
    """The part of the prompt's end the answer's parse starts with: a
    generation prompt that opens the thoughts (``...<think>\\n``, DeepSeek
    R1, QwQ) puts the model inside them."""
    if fmt.think is None:
        return ""
    start, end = fmt.think
    k = prompt.rfind(start.strip())
    if k < 0 or end.strip() in prompt[k:]:
        return ""
    return prompt[k:]
