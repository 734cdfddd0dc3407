"""Chat templates: the GGUF's jinja template, or a built-in one by name.

Like llama-server: ``--chat-template NAME`` picks a built-in template,
anything else given there is jinja source; with neither, the GGUF's
``tokenizer.chat_template`` is used, and a model without one gets ChatML
(common/chat.cpp falls back to CHATML_TEMPLATE_SRC) -- except a Gemma model
without one (the default model's GGUF carries none), which gets the Gemma
template: ChatML turns would be noise to it. This is our one deliberate
difference from llama-server here. Templates render in a
sandbox with ``raise_exception``, ``strftime_now``, ``bos_token`` and
``eos_token``; a template error is the client's (400), as in llama-server.
"""
from __future__ import annotations

import datetime
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import bad

CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

LLAMA3 = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

BUILTIN = {"chatml": CHATML, "gemma": GEMMA, "llama3": LLAMA3}


def _raise(msg: str):
    raise jinja2.TemplateError(msg)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template plus the special-token strings it may use."""

    def __init__(self, source: str, bos: str, eos: str):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, ensure_ascii=False, indent=indent)
        self.source, self.bos, self.eos = source, bos, eos
        self.tmpl = env.from_string(source)

    @classmethod
    def pick(cls, override: str, gguf: str, bos: str, eos: str, arch: str = "") -> "ChatTemplate":
        fallback = GEMMA if arch.startswith("gemma") else CHATML
        src = BUILTIN.get(override, override) or gguf or fallback
        if src == "chatml":
            src = CHATML
        return cls(src, bos, eos)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        """The prompt text; a leading BOS string is stripped because the
        tokenizer adds BOS itself (common/chat.cpp avoids a double BOS so).
        ``extra`` (chat_template_kwargs) cannot override our variables."""
        ctx = dict(extra or {})
        ctx.update(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=self.bos, eos_token=self.eos)
        try:
            out = self.tmpl.render(**ctx)
        except jinja2.TemplateError as e:
            raise bad(f"chat template error: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise bad(f"chat template error: {type(e).__name__}: {e}") from None
        if self.bos and out.startswith(self.bos):
            out = out[len(self.bos):]
        return out


def normalize(messages) -> list[dict]:
    """Validate OpenAI messages; flatten text parts into one string.

    A message needs a string ``role``; ``content`` is a string, null, or a
    list of ``{"type": "text", "text": ...}`` parts (joined by newlines, as
    llama-server does for templates without typed content). Other part types
    (images, audio) are not supported by a text model: 400.
    """
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' is required" if messages is None else "'messages' must be a non-empty array")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object")
        role = m.get("role")
        if not isinstance(role, str):
            raise bad(f"messages[{i}]: 'role' must be a string")
        c = m.get("content")
        if c is None:
            text = ""
        elif isinstance(c, str):
            text = c
        elif isinstance(c, list):
            parts = []
            for p in c:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise bad(f"messages[{i}]: only text content parts are supported")
                parts.append(p["text"])
            text = "\n".join(parts)
        else:
            raise bad(f"messages[{i}]: 'content' must be a string, an array or null")
        msg = {k: v for k, v in m.items() if k != "content"}
        msg["content"] = text
        out.append(msg)
    return out
