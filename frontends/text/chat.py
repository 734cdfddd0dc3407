"""Chat templates: the GGUF's jinja template, or a built-in one by name.

Like llama-server: ``--chat-template NAME`` (or ``--chat-template-file``)
with one of llama.cpp's built-in names (``llama_chat_builtin_templates``:
chatml, llama3, command-r, gemma, ...) renders through llama.cpp's own C++
code (``llama_chat_apply_template``), byte for byte what llama-server
renders for that name (its ``--no-jinja`` route; under ``--jinja`` it
would take the bare name as a template source); anything else given there is
jinja source; with neither, the GGUF's
``tokenizer.chat_template`` is used, and a model without one gets ChatML
(common/chat.cpp falls back to CHATML_TEMPLATE_SRC) -- except a Gemma model
without one (the default model's GGUF carries none), which gets the Gemma
template: ChatML turns would be noise to it. This is our one deliberate
difference from llama-server here. Templates render in a
sandbox with ``raise_exception``, ``strftime_now``, ``bos_token`` and
``eos_token``; a template error is the client's (400), as in llama-server.
Where jinja2 and llama.cpp's jinja runtime part, the template renders as
there: undefined + string is the string, ``|safe`` escapes nothing,
``{% generation %}`` is a plain block, a template may mutate its own lists
(the sandbox still refuses unsafe attributes), and a system message a
template refuses goes before the next turn (common/chat.cpp's workaround).
"""
from __future__ import annotations

import copy
import ctypes
import datetime
import functools
import json

import jinja2
import jinja2.ext
from jinja2.sandbox import SandboxedEnvironment

from .errors import bad
from .fields import get_bool

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



@functools.lru_cache(maxsize=1)
def builtin_names() -> tuple[str, ...]:
    """llama.cpp's built-in template names (llama-server --help lists them)."""
    import llama_cpp

    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return tuple(a.decode() for a in arr)


def _raise(msg: str):
    raise jinja2.TemplateError(msg)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _dates() -> dict:
    now = datetime.datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def _tojson(v, indent=None, ensure_ascii=False, separators=None, sort_keys=False, **_) -> str:
    """jinja's tojson as llama.cpp's runtime writes it: ", " and ": ",
    UTF-8 kept, filters' generators (``map``, ``select``) as arrays."""
    def plain(o):
        if isinstance(o, (str, bytes, dict)):
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
        try:
            return list(o)
        except TypeError:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable") from None
    return json.dumps(v, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=plain)


class BuiltinTemplate:
    """A llama.cpp built-in template, rendered by llama.cpp itself.

    ``extra`` (chat_template_kwargs, tools) means nothing to these C++
    renderers and is ignored, as llama-server's legacy route ignores it."""

    def __init__(self, name: str):
        self.source = name  # what /props shows, as llama-server does

    def render(self, messages: list[dict], add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        import llama_cpp

        arr = (llama_cpp.llama_chat_message * len(messages))()
        keep = []  # the bytes objects must outlive the call
        for i, m in enumerate(messages):
            role, content = m["role"].encode(), m["content"].encode()
            if b"\0" in role or b"\0" in content:
                raise bad("chat template error: a message holds a NUL character")
            keep += (role, content)
            arr[i].role, arr[i].content = role, content
        size = 256 + 2 * sum(len(b) for b in keep)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(self.source.encode(), arr, len(messages),
                                                     add_generation_prompt, buf, size)
            if n < 0:
                raise bad("this custom template is not supported, try using --jinja")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n
        raise bad("failed to apply chat template")


# common_chat_templates_init's two patches: gpt-oss's and Mistral's templates
# refuse messages llama-server sends them (an analysis channel in content; a
# tool-call turn without content), so it rewrites those checks to false.
_PATCHES = (("<|channel|>", '{%- if "<|channel|>analysis<|message|>" in message.content or '
             '"<|channel|>final<|message|>" in message.content %}'),
            ("[TOOL_CALLS]", "{%- if (message['content'] is none or message['content'] == '' or "
             "message['content']|length == 0) and (message['tool_calls'] is not defined or "
             "message['tool_calls'] is none or message['tool_calls']|length == 0) %}"))


def patched(source: str) -> str:
    for marker, check in _PATCHES:
        if marker in source:
            source = source.replace(check, "{%- if false %}")
    return source


class _Undefined(jinja2.Undefined):
    """llama.cpp's jinja runtime joins an undefined value and a string as
    the string alone (runtime.cpp workaround_concat_null_with_str):
    firefunction v2's ``suffix + "\\n" + functions`` renders there."""

    def __add__(self, other):
        return other if isinstance(other, str) else super().__add__(other)

    def __radd__(self, other):
        return other if isinstance(other, str) else super().__radd__(other)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant
    mask): its body renders as is, as llama.cpp's parser ignores the tags."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class ChatTemplate:
    """One compiled template plus the special-token strings it may use."""

    def __init__(self, source: str, bos: str, eos: str, add_bos: bool = True):
        env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=_Undefined,
                                            extensions=["jinja2.ext.loopcontrols", _Generation])
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        env.filters["tojson"] = _tojson
        # llama.cpp's jinja has no HTML escaping: "..."|safe + text leaves the text as it is
        # (jinja2's Markup would escape it: functionary v3.1's tool list)
        env.filters["safe"] = lambda v: v
        self.source, self.bos, self.eos = source, bos, eos
        self.add_bos = add_bos  # the tokenizer adds BOS: a rendered one is stripped
        self.tmpl = env.from_string(patched(source))

    @classmethod
    def pick(cls, override: str, gguf: str, bos: str, eos: str, arch: str = "",
             add_bos: bool = True) -> "ChatTemplate | BuiltinTemplate":
        """--chat-template (a built-in name or jinja source), else the GGUF's, else the fallback."""
        if override.strip() in builtin_names():
            return BuiltinTemplate(override.strip())
        fallback = GEMMA if arch.startswith("gemma") else CHATML
        return cls(override or gguf or fallback, bos, eos, add_bos)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        """The prompt text; a leading BOS string is stripped only when the
        tokenizer adds BOS itself (common/chat.cpp's add_bos: it avoids a
        double BOS so). SmolLM2's BOS text is ``<|im_start|>``, which its
        vocabulary does not add: the text stays, as llama-server shows it.
        ``extra`` (chat_template_kwargs) cannot override our variables."""
        ctx = {"enable_thinking": True, **_dates(), **(extra or {})}  # llama-server's defaults (common_chat_extra_context)
        if "<|channel|>" not in self.source:  # common/chat.cpp: developer is system for all but gpt-oss
            messages = [_as_system(m) if isinstance(m, dict) and m.get("role") == "developer" else m
                        for m in messages]
        messages = self._system_merged(messages)
        ctx.update(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=self.bos, eos_token=self.eos)
        try:
            out = self.tmpl.render(**ctx)
        except jinja2.TemplateError as e:
            raise bad(f"chat template error: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise bad(f"chat template error: {type(e).__name__}: {e}") from None
        if self.add_bos and self.bos and out.startswith(self.bos):
            out = out[len(self.bos):]
        return out


    @functools.cached_property
    def supports_system(self) -> bool:
        """jinja caps' supports_system_role, where it shows: a template that
        refuses a system message (Gemma 2 raises) but renders the user turn
        alone takes no system role. (llama.cpp also counts a template that
        never reads the system content; ringserve leaves that one as it is.)"""
        def ok(msgs: list[dict]) -> bool:
            try:
                self.tmpl.render(messages=msgs, add_generation_prompt=False, bos_token=self.bos,
                                 eos_token=self.eos, enable_thinking=True, **_dates())
            except Exception:  # noqa: BLE001 -- any refusal counts
                return False
            return True

        user = {"role": "user", "content": "U"}
        return ok([{"role": "system", "content": "S"}, user]) or not ok([user])

    def _system_merged(self, messages: list[dict]) -> list[dict]:
        """common/chat.cpp's system_message_not_supported: where the template
        takes no system role, the system message's content goes before the
        next message's, a newline between (alone, it is dropped)."""
        if not messages or not isinstance(messages[0], dict) or messages[0].get("role") != "system" \
                or self.supports_system:
            return messages
        if len(messages) == 1:
            return []
        first, second = messages[0], messages[1]
        if not isinstance(first.get("content"), str) or not isinstance(second.get("content"), str):
            return messages
        return [{**second, "content": first["content"] + "\n" + second["content"]}, *messages[2:]]


def _as_system(m: dict) -> dict:
    """A developer message as a system one (OpenAI's newer name for it;
    llama-server's map_developer_role_to_system); a copy keeps its class (Parts)."""
    out = copy.copy(m)
    out["role"] = "system"
    return out


class Parts(dict):
    """A message whose content came as text parts. The template sees them
    joined by newlines (``content``); continued as an assistant prefill they
    are joined by a blank line (``continued``): llama-server appends the
    continued message with ``common_chat_msg::render_content()``, whose
    delimiter is two newlines (common/chat.h), so parts "Wh", "ill" go on
    from "Wh" + 2 newlines + "ill"."""

    continued: str = ""


def normalize(messages) -> list[dict]:
    """Validate OpenAI messages; flatten text parts into one string.

    A message needs a string ``role``; ``content`` is a string, null (an
    empty message, as llama-server takes it), or a list of
    ``{"type": "text", "text": ...}`` parts (joined by newlines, as
    llama-server does for templates without typed content). Other part types
    (images, audio) are not supported by a text model: 400. A message with
    no ``content`` key at all is llama-server's 400 at once (an assistant
    message may carry ``tool_calls`` instead), not an empty turn that sends
    the model generating to the end of its context.
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
        if "content" not in m:
            if role != "assistant":
                raise bad("All non-assistant messages must contain 'content'")
            if "tool_calls" not in m:
                raise bad("Assistant message must contain either 'content' or 'tool_calls'!")
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
        if isinstance(c, list) or isinstance(m, Parts):  # normalized twice (tools.prepare, then render): kept
            msg = Parts(msg)
            msg.continued = "\n\n".join(parts) if isinstance(c, list) else m.continued
        out.append(msg)
    return out


def continuation(v) -> str:
    """llama-server's continue_final_message values (common/chat.cpp
    common_chat_continuation_parse): true or "content" continue the content,
    "reasoning_content" the reasoning; anything else is no continuation."""
    if v is True:
        return "auto"
    if v in ("content", "reasoning_content"):
        return v
    return ""


def chat_prompt(tmpl, messages: list[dict], body: dict, prefill: bool = True, extra: dict | None = None) -> str:
    """The prompt of a chat request (llama-server's oaicompat_chat_params_parse).

    ``add_generation_prompt`` (default true) and ``continue_final_message``
    (vLLM's fields) are exclusive: both set is a 400. With ``prefill``
    (--prefill-assistant, the default) a final assistant message is
    continued, not closed: the template renders the messages before it
    without the generation prompt, then that generation prompt (what
    add_generation_prompt adds there), then the message's content, with no
    end-of-turn -- so the model goes on from the content's last character.
    ``extra`` holds the template's further variables (chat_template_kwargs,
    and whatever hooks add, e.g. tools)."""
    agp = get_bool(body, "add_generation_prompt", True)
    cont = continuation(body.get("continue_final_message"))
    if not cont and prefill and messages and messages[-1].get("role") == "assistant":
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise bad("Cannot have 2 or more assistant messages at the end of the list.")
        cont, agp = "auto", False
    if cont and agp:
        raise bad("Cannot set both add_generation_prompt and continue_final_message to true.")
    if not cont:
        return tmpl.render(messages, agp, extra)
    last = messages[-1]
    if last.get("role") == "assistant" and last.get("tool_calls"):
        raise bad("Cannot continue an assistant message that contains tool calls.")
    head = messages[:-1]
    closed, opened = tmpl.render(head, False, extra), tmpl.render(head, True, extra)
    k = 0
    while k < min(len(closed), len(opened)) and closed[k] == opened[k]:
        k += 1
    tail = "" if cont == "reasoning_content" else getattr(last, "continued", last.get("content", ""))
    return closed + opened[k:] + tail


def text_of(where: str, content, kinds: tuple[str, ...] = ("input_text", "output_text", "text"),
            skip: tuple[str, ...] = ()) -> str:
    """A message's text: a string, or text parts of ``kinds`` joined by
    newlines (parts of ``skip`` dropped); anything else is a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}: 'content' must be a string or an array of content parts")
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in skip:
            continue
        if kind not in kinds:
            raise bad(f"{where}: content part type {kind!r} is not supported by this server")
        if not isinstance(p.get("text"), str):
            raise bad(f"{where}: a {kind} part needs a string 'text'")
        out.append(p["text"])
    return "\n".join(out)
