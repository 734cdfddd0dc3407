"""``gunicorn -c frontends/gunicorn_conf.py frontends.app:app``: the documented
path of the plain-gunicorn config, kept for those who deploy gunicorn their own
way. The settings and hooks live in frontends/process/gunicorn_conf.py (see its
docstring for RINGSERVE_ARGS and what gunicorn's own flags override)."""
from frontends.process.gunicorn_conf import *  # noqa: F401,F403
