"""The HTTP side of ringserve: everything but the decode loop.

Four rooms, each importing only the rooms below it (and engine/, ipc/):

* ``process/`` (top): the processes and their supervision. ``launcher.py`` is
  the process tree (launcher -> engine + gunicorn master -> workers); ``cli.py``
  the ``ringserve`` command; ``serve.py``, ``hooks.py``, ``worker.py``,
  ``procs.py``, ``gunicorn_conf.py`` the gunicorn master, its hooks, the worker
  class and the engine child.
* ``api/``: one module per API family (native, openai, responses, anthropic,
  embed, infill, slotfile, misc, metrics, fleet, openapi, webui) and the app's gates
  (auth, cors). ``app.py``'s route table is the index: every path served is
  one row there.
* ``http/``: what every endpoint shares: the worker's context (``ctx``), one
  request's leases driven to text steps (``gen``), SSE framing (``stream``).
* ``text/`` (bottom): text work with no HTTP in it: llama-server's error shape
  (``errors``), validation of request fields into an engine plan (``params``,
  ``schemas``), chat templates (``chat``), tool calls (``tools``,
  ``toolparse``), reasoning (``reasoning``), one answer's deltas (``reply``), the tokenizer and incremental detokenizing (``tokenizer``,
  ``detok``).

``testing/`` is test plumbing for tests/ and scripts/ (falcon.testing's role)
and may import any room. ``frontends.app:app`` and ``frontends/gunicorn_conf.py``
are the documented paths for running gunicorn by hand; they forward to api/ and
process/.
"""
