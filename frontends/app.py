"""``frontends.app:app``: the documented gunicorn app path, kept for those who
run gunicorn themselves. The app and its route table live in frontends/api/app.py;
this module only forwards to it (the attribute is built on first access, once
per worker, so importing either module has no side effect)."""
from frontends.api.app import build, build_from_env, routes  # noqa: F401


def __getattr__(name: str):
    if name == "app":
        return build_from_env()
    raise AttributeError(name)
