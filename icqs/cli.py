"""The `icqs` command line. Subcommands of this package: score, leaderboard, report, demo; the judges and ALLURE
packages add theirs through `register(subparsers)` in icqs.judges.cli and icqs.allure.cli.

Contract for a registered subcommand: `subparsers.add_parser(...)`, then `parser.set_defaults(func=handler)` where
`handler(args) -> int | None` is the exit status. Bad input raises engine.errors.UserError: main() prints
`error: <message>` on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from engine.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="icqs", description="In-context quality scoring of LLM answers.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _subcommand_modules():
        module.register(subparsers)
    return parser


def register(subparsers) -> None:
    """This package's own subcommands (their heavy imports happen inside the handlers)."""


def _subcommand_modules() -> list:
    """The modules whose `register(subparsers)` adds subcommands."""
    modules = [sys.modules[__name__]]
    for name in ("icqs.judges.cli", "icqs.allure.cli"):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if not (name == e.name or name.startswith(f"{e.name}.")):  # "not written yet" only, not a broken import
                raise
    return modules


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (finished results are kept; run the same command again to resume)", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
