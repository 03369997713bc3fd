"""The argument parser of every command line (`python -m engine ...`, `icqs ...`): a bad option is one stderr line
`error: ...` and exit status 2, like every other bad input (argparse's own usage block is left out: `--help`
shows it). `check_output_file` checks an output path before any work."""
from __future__ import annotations

import argparse
import os
import sys

from engine.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line. Subcommand parsers made by `add_subparsers` are of the
    same class, so they behave alike. Abbreviated options (`--worker` for `--workers`) are not accepted."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str):
        first = " ".join(message.split())  # argparse messages can span lines (e.g. a long list of choices)
        print(f"error: {first}", file=sys.stderr)
        raise SystemExit(2)


def check_output_file(output: str, inputs: tuple[str, ...] = ()) -> None:
    """A file the command may create or append to: not a folder, its folder exists and is writable, not an input."""
    if os.path.isdir(output):
        raise UserError("is a directory; expected a file", output)
    if os.path.exists(output) and not os.path.isfile(output):
        raise UserError("not a regular file (a device or a pipe); expected a file", output)
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise UserError(f"the output folder {folder} does not exist", output)
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(output) and not os.access(output, os.W_OK)):
        raise UserError("not writable", output)
    if os.path.exists(output) and any(os.path.exists(p) and os.path.samefile(p, output) for p in inputs):
        raise UserError("is also an input file; expected a separate output file", output)
