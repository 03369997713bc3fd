"""One table, two renderings: aligned plain text for the terminal and an HTML table for a report. The judge and
pairwise summaries (icqs.judges.results) build their tables once, as rows of already formatted cells; `icqs judge`,
`icqs pairwise`, `icqs leaderboard | audit DIR` print them and `icqs report DIR` puts them in the page
(icqs.report_runs), so what the terminal says and what the report says cannot drift apart. Machines read the
summaries themselves (`--json`), not these tables."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field


def num(v, digits: int = 2) -> str:
    """A number as a table shows it: `digits` decimals, integers as they are, None / nan as '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}"


def ci(interval, digits: int = 2) -> str:
    """A confidence interval [low, high] as '[low, high]', '-' when there is none."""
    if not interval or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in interval):
        return "-"
    return f"[{num(interval[0], digits)}, {num(interval[1], digits)}]"


NUMERIC = re.compile(r"[#+-]?[0-9.]*|\[[0-9., +-]*\]")  # 0.25, -, #2, [0.10, 0.90]


@dataclass(frozen=True)
class Table:
    """`columns` and `rows` of formatted cells; a column of numbers (every cell a number, '-', a rank '#2' or an
    interval) is right-aligned, the others left. A row whose index is in `flagged` is marked: a leading '!' in
    text, a red row in HTML. `notes` follow the table (a note starting with '!' is a warning)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    flagged: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self):
        if any(len(r) != len(self.columns) for r in self.rows):
            raise ValueError(f"table {self.title!r}: every row needs {len(self.columns)} cells")

    def _right(self) -> list[bool]:
        return [bool(self.rows) and all(NUMERIC.fullmatch(r[i]) for r in self.rows) for i in range(len(self.columns))]

    def text(self) -> str:
        mark = "  " if self.flagged else ""
        widths = [max([len(c)] + [len(r[i]) for r in self.rows]) for i, c in enumerate(self.columns)]
        right = self._right()

        def line(cells, prefix: str) -> str:
            return (
                prefix + "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right))
            ).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns, mark))
        out += [line(r, ("! " if i in self.flagged else "  ") if self.flagged else "") for i, r in enumerate(self.rows)]
        out += [f"  {n}" for n in self.notes]
        return "\n".join(out)

    def html(self) -> str:
        right = self._right()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            f"<tr{' class=flag' if i in self.flagged else ''}>"
            + "".join(
                f"<td class=num>{html.escape(c)}</td>" if r else f"<td>{html.escape(c)}</td>"
                for c, r in zip(cells, right)
            )
            + "</tr>"
            for i, cells in enumerate(self.rows)
        )
        notes = "".join(
            f"<p class=warn>{html.escape(n)}</p>" if n.startswith("!") else f"<p>{html.escape(n)}</p>"
            for n in self.notes
        )
        title = f"<h3>{html.escape(self.title)}</h3>" if self.title else ""
        return f"{title}<table><tr>{head}</tr>{body}</table>{notes}"


# ---- what a command prints ------------------------------------------------------------------------------------------
def add_json_arg(p) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON document on stdout (for machines) instead of tables",
    )


def show(args, data, text: str, warnings=()) -> None:
    """The one output policy of the commands that print results: with --json `data` as one JSON document on stdout
    and nothing else there; otherwise `text` (tables) on stdout unless --quiet. `warning:` lines go to stderr in
    every mode (--quiet included: a result its own checks distrust is never silent)."""
    import json
    import sys

    from .io import strict_json

    if getattr(args, "json", False):
        print(json.dumps(strict_json(data), indent=1, ensure_ascii=False))
    elif not getattr(args, "quiet", False) and text:
        print(text.rstrip("\n"))
    for line in warnings:
        print(line, file=sys.stderr)


def say(args, line: str) -> None:
    """An informational line (a file written, the engine's work, what to do next): on stderr, so that stdout holds
    only the results (tables or the --json document); not at all with --quiet."""
    import sys

    if not getattr(args, "quiet", False):
        print(line, file=sys.stderr)
