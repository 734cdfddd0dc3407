"""Grammars for the native formats. tool_choice "auto" leaves the model
free (llama-server's lazy grammar would start at the format's trigger: see
docs/ARCHITECTURE.md "Native tool-call formats" for what ringserve does);
"required" (or a named function) holds the answer to the format's calls
from its first token."""
from __future__ import annotations


def required(fmt, spec) -> str:
    """GBNF for a required call in ``fmt``'s syntax ("" for "auto")."""
    return ""
