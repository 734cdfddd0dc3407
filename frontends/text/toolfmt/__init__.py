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
does (tools, tool calls, tool results), so the template renders it. A
format parses the answer after the thoughts: the reasoning split
(frontends/text/reasoning.py, in reply.py's Reply) serves every template;
only gpt-oss's channels carry their own (``Format.splits_thoughts``).
``grammar.py`` (and ``until.py``) build each format's grammar.

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

__all__ = ["Call", "Format", "Msg", "Stream", "FAMILIES", "detect", "pick"]


def detect(src: str) -> type[Format] | None:
    """The family of a template source, None for the generic form."""
    for fam in FAMILIES:
        if fam.detect(src):
            return fam
    return None


@functools.lru_cache(maxsize=8)
def pick(tmpl) -> Format | None:
    """The template's native format (None: the generic JSON form): the
    family its source names, kept only where the template shows tool calls."""
    fam = detect(getattr(tmpl, "source", "") or "")
    if fam is None or not history.shows_calls(tmpl):
        return None
    return fam(tmpl.source)
