"""Progress of long jobs, for every command: a tqdm bar on a terminal; anywhere else (a log file, a pipe, CI) plain
lines, without escape codes or carriage returns, one per bar every ICQS_PROGRESS_INTERVAL seconds (default 10) and
one when a bar that printed finishes:

    evaluator audit: 12/24 folds (50%), 00:41 elapsed, 00:41 left

`progress_bar(...)` takes tqdm's arguments (an iterable, total, desc, unit, unit_scale, initial, disable) and
returns an object with tqdm's interface as the commands use it: iteration, update(n), reset(total), close(), `with`,
n, total.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

DEFAULT_INTERVAL = 10.0  # seconds between two plain lines of one bar


def interval() -> float:
    """ICQS_PROGRESS_INTERVAL (seconds, > 0), else DEFAULT_INTERVAL."""
    try:
        value = float(os.environ.get("ICQS_PROGRESS_INTERVAL", DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


def is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(
    iterable=None,
    *,
    total=None,
    desc: str = "",
    unit: str = "it",
    unit_scale: bool = False,
    initial: int = 0,
    disable: bool = False,
    file=None,
):
    """A tqdm bar when `file` (default: stderr) is a terminal, else a PlainProgress with the same interface."""
    stream = file if file is not None else sys.stderr
    if disable or is_terminal(stream):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=unit_scale,
            initial=initial,
            disable=disable,
            file=stream,
        )
    return PlainProgress(
        iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, initial=initial, file=stream
    )


class PlainProgress:
    """Progress as whole lines for a stream that is not a terminal: no bar, no escape codes, no carriage returns."""

    def __init__(
        self,
        iterable=None,
        *,
        total=None,
        desc: str = "",
        unit: str = "it",
        unit_scale: bool = False,
        initial: int = 0,
        file=None,
    ):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.unit, self.unit_scale = iterable, total, desc, unit, unit_scale
        self.n = initial
        self._initial = initial
        self._file = file if file is not None else sys.stderr
        self._start = self._last = time.monotonic()
        self._interval = interval()
        self._printed = self._closed = False

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return self.total if self.total is not None else len(self.iterable)

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._line(now)

    def reset(self, total=None) -> None:
        """Start again from `initial` with a new total (tqdm's reset), e.g. once a job knows its size."""
        self.n, self.total = self._initial, total
        self._start = self._last = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._printed:  # a bar that printed says that it finished
            self._line(time.monotonic())

    def line(self, now: float | None = None) -> str:
        """The progress line: '{desc}: n/total unit (p%), elapsed, left' (no total: 'n unit, elapsed')."""
        elapsed = (time.monotonic() if now is None else now) - self._start
        fmt = tqdm.format_sizeof if self.unit_scale else (lambda v: f"{v:,}")
        head = f"{self.desc}: " if self.desc else ""
        if not self.total:
            return f"{head}{fmt(self.n)} {self.unit}, {tqdm.format_interval(elapsed)} elapsed"
        done = self.n - self._initial
        left = (self.total - self.n) * elapsed / done if done > 0 else None
        return (
            f"{head}{fmt(self.n)}/{fmt(self.total)} {self.unit} ({100 * self.n / self.total:.0f}%), "
            f"{tqdm.format_interval(elapsed)} elapsed"
            + (f", {tqdm.format_interval(left)} left" if left is not None and self.n < self.total else "")
        )

    def _line(self, now: float) -> None:
        try:
            self._file.write(self.line(now) + "\n")
            self._file.flush()
        except (OSError, ValueError):  # a closed or broken stream loses progress, never the job
            return
        self._last, self._printed = now, True
