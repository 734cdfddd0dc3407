"""The processes and their supervision: the ``ringserve`` command (``cli``),
the launcher that supervises the engine and the gunicorn master (``launcher``:
the process tree), the engine child (``procs``), the gunicorn master (``serve``),
its hooks (``hooks``), the worker class (``worker``) and the plain-gunicorn
config (``gunicorn_conf``).

May import frontends.api (the master loads the app), frontends.text (the
master preloads the vocabulary), engine and ipc. Nothing below imports this.
"""
