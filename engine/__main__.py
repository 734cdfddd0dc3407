"""``python -m engine --arena INSTANCE``: an exec'd engine (engine/run.py)."""
from __future__ import annotations

import argparse
import sys

from .run import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine")
    ap.add_argument("--arena", required=True)
    return run(ap.parse_args(argv).arena)


if __name__ == "__main__":
    sys.exit(main())
