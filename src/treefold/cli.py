"""The ``treefold`` command: demo, bench, check, info."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="treefold", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the numerics experiments, measured on this machine")
    demo.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    demo.add_argument("--quick", action="store_true", help="smaller sizes (seconds, for tests)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        return demo_mod.main(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
