"""The argument parser of every command line (`python -m engine ...`, `icqs ...`): a bad option is one stderr line
`error: ...` and exit status 2, like every other bad input (argparse's own usage block is left out: `--help`
shows it)."""
from __future__ import annotations

import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line. Subcommand parsers made by `add_subparsers` are of the
    same class, so they behave alike."""

    def error(self, message: str):
        first = " ".join(message.split())  # argparse messages can span lines (e.g. a long list of choices)
        print(f"error: {first}", file=sys.stderr)
        raise SystemExit(2)
