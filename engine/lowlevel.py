"""``llama_cpp`` with its ctypes bindings only, the rest loaded on first use.

Why: ``import llama_cpp`` runs the package's ``__init__``, which imports
``llama_cpp.llama`` (the high-level ``Llama`` class) and with it jinja2,
diskcache, sqlite3, multiprocessing and the chat-format tables: ~6 MiB of
Python objects in every process that imports it (the engine, the gunicorn
master and, copy-on-write, its workers), none of which ringserve uses; it
calls the C API only (``llama_cpp.llama_cpp``).

``install()`` (before the first ``import llama_cpp`` of the process) puts a
package module in ``sys.modules`` that holds what ``from .llama_cpp import *``
would give it (every public name of the bindings) and ``__version__``; any
other attribute (``Llama``, ``LlamaGrammar``, ...) imports
``llama_cpp.llama`` on first access (PEP 562 ``__getattr__``), so code that
wants the high-level API still gets it. Submodules (``llama_cpp.llama_grammar``)
import as usual from the package's directory. If ``llama_cpp`` is already
imported, nothing changes.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types


def install() -> types.ModuleType:
    """The ``llama_cpp`` module of this process (a light one if none yet)."""
    if "llama_cpp" in sys.modules:
        return sys.modules["llama_cpp"]
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        import llama_cpp  # let the real import raise its own error

        return llama_cpp
    pkg = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    sys.modules["llama_cpp"] = pkg
    try:
        low = importlib.import_module("llama_cpp.llama_cpp")
    except BaseException:
        del sys.modules["llama_cpp"]
        raise
    pkg.__dict__.update((k, v) for k, v in vars(low).items() if not k.startswith("_"))
    pkg.llama_cpp = low
    with open(spec.origin, encoding="utf-8") as f:  # the package's own __version__ line
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    if m:
        pkg.__version__ = m[1]

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        high = importlib.import_module("llama_cpp.llama")
        try:
            return getattr(high, name)
        except AttributeError:
            raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}") from None

    pkg.__getattr__ = __getattr__
    return pkg
