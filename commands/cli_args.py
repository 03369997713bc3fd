"""The argument parser of every command line (`python -m engine ...`, `icqs ...`): a bad option is one stderr line
`error: ...` and exit status 2, like every other bad input (argparse's own usage block is left out: `--help`
shows it). `check_output_file` checks an output path before any work; `check_report_output` the `--output` of a
command that only reads a run directory (a report): never a file of that or any run directory, never a file that
is not an HTML report."""

from __future__ import annotations

import argparse
import errno
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


def check_output_path(path, what: str | None = "the output") -> str:
    """Every output path a user names (a file or a folder): not empty (`''` would write into the current folder
    under no name the user gave) and not the file system's root. Returns it. `what` starts the message."""
    text, head = os.fspath(path), f"{what}: " if what else ""
    if not text.strip():
        raise UserError(f"{head}an empty path; name the file or folder to write")
    real = os.path.realpath(text)
    if os.path.dirname(real) == real:
        raise UserError(f"{head}{text!r} is the file system's root; name a file or folder under it")
    return text


def output_path(text: str) -> str:
    """An argparse type for output options: check_output_path, as the option's error."""
    try:
        return check_output_path(text, None)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def input_path(text: str) -> str:
    """An argparse type for the files and folders a command reads: not empty (`''` would read the current folder,
    or, for an optional file, nothing at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name the file or folder to read")
    return text


def check_output_file(output: str, inputs: tuple[str, ...] = ()) -> None:
    """A file the command may create or append to: not a folder, its folder exists and is writable, not an input."""
    check_output_path(output)
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
    _probe(output)


def _probe(output: str) -> None:
    """Open the output for appending (and remove it again if this made it): what os.access cannot tell (a root
    user in /proc, a read-only or full file system) fails here, before any work."""
    existed = os.path.exists(output)
    try:
        fd = os.open(output, os.O_WRONLY | os.O_APPEND | (0 if existed else os.O_CREAT | os.O_EXCL), 0o644)
    except OSError as e:
        raise UserError(f"cannot be written ({e.strerror or e})", output) from None
    os.close(fd)
    if not existed:
        os.unlink(output)


ENVIRONMENT = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG}  # the machine's fault, not the input's: status 1


def os_error(e: OSError) -> tuple[str, int]:
    """An OSError that reached a command's main (disk full while writing, a folder made unwritable mid-run): its
    one-line `error:` message and exit status (1 for the environment's failures, 2 otherwise)."""
    where = e.filename if e.filename is not None else None
    what = e.strerror or str(e)
    hint = (
        "; free some space and run the same command again to resume" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    )
    return f"error: {UserError(f'{what}{hint}', where)}", 1 if e.errno in ENVIRONMENT else 2


def run_command(command, args, interrupted: str) -> int:
    """A command's main body, `command(args)`, with the errors every command line reports the same way: a UserError
    or an OSError as one `error:` line (status 2, or 1 for the environment's failures), Ctrl-C as `interrupted`
    (status 130)."""
    try:
        return int(command(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # ENOSPC, an output made unwritable mid-run: one line
        message, status = os_error(e)
        print(message, file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"interrupted ({interrupted}; run the same command again to resume)", file=sys.stderr)
        return 130


RUN_MARKER = "run.json"  # what makes a folder a run directory (icqs.run)


def check_report_output(output: str, run_dir: str, default_name: str) -> None:
    """The `--output` of a command that reads the run directory `run_dir` and writes an HTML report: allowed only
    as the default `run_dir/default_name` or outside every run directory, and an existing file is replaced only if
    it is an HTML report (so a run's logs, run.json, or the user's task or candidates file are never destroyed)."""
    check_output_file(output)
    target = os.path.realpath(output)
    if target == os.path.realpath(os.path.join(run_dir, default_name)):
        return
    folder = os.path.dirname(target)
    while True:
        if os.path.isfile(os.path.join(folder, RUN_MARKER)):
            raise UserError(
                f"is inside the run directory {folder} (which this command only reads); write the report "
                "outside it, or leave --output out for the default",
                output,
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if os.path.isfile(target):
        try:
            with open(target, "rb") as f:
                head = f.read(64).lstrip().lower()
        except OSError as e:
            raise UserError(f"cannot read: {e.strerror or e}", output) from None
        if not head.startswith((b"<!doctype html", b"<html")):
            raise UserError("exists and is not an HTML report; refusing to overwrite it (choose another name)", output)
