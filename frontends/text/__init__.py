"""Text work with no HTTP in it: llama-server's error shape (``errors``, raised
by validation everywhere above), request fields validated into an engine plan
(``params``, ``schemas``), chat templates (``chat``), tool calls (``tools``:
the request side; ``toolfmt/``: each template family's native syntax,
detected, rendered, grammar-held and parsed; ``toolparse``: llama-server's
generic JSON form, the fallback), the thinking split (``reasoning``), one
answer's OpenAI deltas (``reply``), the worker's tokenizer
(``tokenizer``) and incremental UTF-8-safe detokenizing with stop strings
(``detok``).

May import engine (the vocabulary) and ipc (parameter rows, record limits);
never another frontends room.
"""
