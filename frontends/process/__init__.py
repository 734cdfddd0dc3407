"""The processes and their supervision: the ``ringserve`` command (``cli``),
the launcher that supervises the engine and the gunicorn master (``launcher``:
the process tree), the engine child (``procs``), the gunicorn master forked
from the launcher (``master``) and its Application (``serve``), its hooks
(``hooks``), the worker class (``worker``) and the plain-gunicorn config
(``gunicorn_conf``).

May import frontends.api (the launcher preloads the app before it forks the
master), frontends.text (it loads the vocabulary), engine and ipc. Nothing
below imports this.
"""
