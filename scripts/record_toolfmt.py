"""Record the native tool-call goldens from llama.cpp's own chat code.

Builds scripts/chat_oracle.cpp against the vendored llama.cpp's
libllama-common.so (the code llama-server runs: template detection, the
autoparser, common_chat_parse) and writes, per template and model output,
what llama-server's parser returns: tests/data/toolfmt_golden.json, read by
tests/test_toolfmt.py. The outputs are llama.cpp's tests/test-chat.cpp
parse cases for each family plus a few of ours (content before a call,
parallel calls, thoughts)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36")
TEMPLATES = os.path.join(ROOT, "src/models/templates")
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "toolfmt_golden.json")
ORACLE = "/tmp/ringserve_chat_oracle"

SF = {"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}
PY = {"type": "function", "function": {"name": "python", "description": "an ipython interpreter", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "description": "Python code to execute."}},
    "required": ["code"]}}}
TOOLS = [SF, PY]

HC = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>'
HP = '<tool_call>\n{"name": "python", "arguments": {"code": "print(\\"hi\\")\\n"}}\n</tool_call>'
DS = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{"arg1": 1}```'
      '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
DS2 = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{"arg1": 1}\n```'
       '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>python\n```json\n{"code": "x"}\n```'
       '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
QC = '<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>'
QP = ('<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print("Hello, world!")\n\nhello()\n'
      '</parameter>\n</function>\n</tool_call>')
LL = '{"name": "special_function", "parameters": {"arg1": 1}}'
CONTENT = "Hello, world!\nWhat's up?"

CASES = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": [CONTENT, HC, "Hello, world!\nWhat's up?" + HC, HC + "\n" + HP],
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": [CONTENT, HC, "Let me check.\n" + HC + HP],
    "Qwen-Qwen2.5-7B-Instruct.jinja": [CONTENT, HC, HC + "\n" + HP, 'a <tool_call>{"name": "x"}</tool_call>'],
    "Qwen-Qwen3-0.6B.jinja": [CONTENT, "<think>\nI'm\nthinking\n</think>\n\n" + CONTENT,
                              "<think>\nhm\n</think>\n\n" + HC + "\n" + HP, HC],
    "Qwen-QwQ-32B.jinja": ["I'm\nthinking\n</think>\n\n" + CONTENT, "hm</think>\n" + HC],
    "meta-llama-Llama-3.1-8B-Instruct.jinja": [CONTENT, LL, '{"type": "function", "name": "special_function", "parameters": {"arg1": 1}}',
                                               "Hello " + LL, "  " + LL],
    "meta-llama-Llama-3.2-3B-Instruct.jinja": [CONTENT, LL],
    "meta-llama-Llama-3.3-70B-Instruct.jinja": [CONTENT, LL, "<|python_tag|>" + LL],
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": [
        CONTENT, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        'Hi [TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}, '
        '{"name": "python", "arguments": {"code": "x"}, "id": "987654321"}]'],
    "openai-gpt-oss-120b.jinja": [
        "<|channel|>final<|message|>" + CONTENT,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + CONTENT,
        '<|channel|>analysis<|message|>I think<|end|><|start|>assistant<|channel|>commentary to=functions.special_function '
        '<|constrain|>json<|message|>{"arg1": 1}',
        '<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}',
        '<|channel|>analysis<|message|>I think<|end|><|start|>assistant to=functions.special_function<|channel|>commentary '
        'json<|message|>{"arg1": 1}',
        '<|channel|>commentary<|message|>preamble<|end|><|start|>assistant<|channel|>commentary to=functions.python '
        '<|constrain|>json<|message|>{"code": "x"}',
        '<|channel|>commentary to=functions.special_function_of_day<|message|>{"arg1": 1}'],
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ["I'm\nthinking</think>" + CONTENT, "I think</think>" + DS2],
    "llama-cpp-deepseek-r1.jinja": ["I'm\nthinking</think>" + CONTENT, "</think>" + DS, "hm</think>Sure." + DS2],
    "Qwen3-Coder.jinja": [CONTENT, QC, QP, "Let me call it.\n" + QC[len("<tool_call>\n"):],
                          QC + "\n" + QP, '<tool_call>\n<function=python>\n<parameter=code>\n格\n</parameter>\n</function>\n</tool_call>'],
}


def build() -> str:
    inc = [f"-I{ROOT}/src/{d}" for d in ("common", "include", "ggml/include", "vendor")]
    lib = f"{ROOT}/build/bin"
    subprocess.run(["g++", "-std=c++17", "-O1", *inc, "-o", ORACLE, os.path.join(HERE, "chat_oracle.cpp"),
                    f"-L{lib}", "-lllama-common", "-lllama", f"-Wl,-rpath,{lib}"], check=True)
    return ORACLE


def oracle(reqs: list[dict]) -> list[dict]:
    r = subprocess.run([ORACLE], input="".join(json.dumps(q) + "\n" for q in reqs), capture_output=True,
                       text=True, timeout=300, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def main() -> None:
    if not os.path.exists(ORACLE) or "--rebuild" in sys.argv:
        build()
    reqs, names = [], []
    for name, outs in CASES.items():
        src = open(os.path.join(TEMPLATES, name)).read()
        reqs.append({"template": src, "messages": [{"role": "user", "content": "Hey"}], "tools": TOOLS,
                     "parallel_tool_calls": True, "reasoning_format": "auto", "outputs": outs})
        names.append(name)
    golden = {}
    for name, q, a in zip(names, reqs, oracle(reqs)):
        a.pop("grammar", None)
        golden[name] = {"outputs": q["outputs"], **a}
    with open(OUT, "w") as f:
        json.dump({"tools": TOOLS, "templates": golden}, f, indent=1, ensure_ascii=False)
    print(f"wrote {OUT}: {sum(len(v['outputs']) for v in golden.values())} cases, {len(golden)} templates")


if __name__ == "__main__":
    main()
