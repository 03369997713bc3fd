"""The ICQS task definition (YAML): the in-context template, the good and bad example pools Z_g and Z_b, the
separators, the label options, the judge question, and the defaults for M, N, L and the seed.

    name: sentiment
    template: "Sentence: {x}\\nAnswer: {y}"   # {x} before {y}; the y part is the scored continuation
    separator: "\\n\\n"                      # between demos, and between the last demo and the candidate
    header: ""                              # optional text before the demos, joined to the first by the separator
    good: [{x: "a fine film", y: positive}]  # inline list, or a JSONL path (relative to this file)
    bad: bad.jsonl
    labels: [negative, positive]             # label options (ICL baseline); default: the y values of the pools
    judge_question: "What is the sentiment of: {x}"   # verbalized judge; default: the template's x part
    M: 4        # ratios r_j = j/M, j = 0..M: the demo set of ratio j holds exactly round(r_j N) good demos
    N: 8        # demos per demo set (N >= M, else two ratios would round to the same count)
    L: 3        # demo sets per ratio (ICQS-Epistemic)
    seed: 0
    balance: marginal     # label tasks: every demo set of a repeat shows the same labels: the label shares of
                          # Z_g (marginal), uniform, or none (free-text tasks ignore it)
    calibrate: false      # also score each answer after a content-free input with the same demo set and report
                          # the calibrated curve (raw minus content-free) beside the raw one
    content_free: "N/A"   # the content-free input x used by calibrate
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

from engine.errors import UserError, did_you_mean

from .contracts import check_row, check_yaml
from .io import check_text, read_jsonl, read_yaml

DEFAULTS = {
    "separator": "\n\n",
    "header": "",
    "M": 4,
    "N": 8,
    "L": 3,
    "seed": 0,
    "balance": "marginal",
    "calibrate": False,
    "content_free": "N/A",
}
LIMITS = {"M": 256, "N": 4096, "L": 1024}  # ratios, demos per set, demo sets: beyond these no model context holds it
BALANCE = ("marginal", "uniform", "none")


@dataclass(frozen=True)
class Example:
    x: str
    y: str


@dataclass
class Task:
    name: str
    template: str
    good: list[Example]
    bad: list[Example]
    separator: str = "\n\n"
    header: str = ""
    labels: list[str] = field(default_factory=list)
    judge_question: str | None = None
    M: int = 4
    N: int = 8
    L: int = 3
    seed: int = 0
    balance: str = "marginal"
    calibrate: bool = False
    content_free: str = "N/A"

    @property
    def good_counts(self) -> list[int]:
        """k_j = round(j N / M) for j = 0..M, halves rounded up: the good demos in the demo set of ratio j."""
        return [(2 * j * self.N + self.M) // (2 * self.M) for j in range(self.M + 1)]

    @property
    def ratios(self) -> list[float]:
        """The realised ratios k_j / N (= j / M when M divides N): the share of good demos in the set of ratio j."""
        return [k / self.N for k in self.good_counts]

    def check_ratio_grid(self, path: str | None = None, line: int | None = None) -> None:
        """Refuse an (M, N) whose rounded good counts repeat: two ratios would be the same hypothesis."""
        if self.M > self.N and self.M > LIMITS["M"]:  # before listing M + 1 counts: M may be huge
            raise UserError(
                f"M = {self.M} ratios need N >= M demos per set (N = {self.N}); raise N or lower M", path, line
            )
        counts = self.good_counts
        if len(set(counts)) != len(counts):
            raise UserError(
                f"M = {self.M} ratios need N >= M demos per set: with N = {self.N} the good counts "
                f"round(j N / M) repeat ({counts}); raise N or lower M",
                path,
                line,
            )

    def check_pool_size(self, path: str | None = None, line: int | None = None) -> None:
        """Refuse N larger than a pool: the all-good (all-bad) demo set would show the same example twice."""
        for key, pool in (("good", self.good), ("bad", self.bad)):
            if self.N > len(pool):
                raise UserError(
                    f"N = {self.N} demos per set, but {key!r} has only {len(pool)} examples (a demo "
                    f"set would repeat them); lower N to at most {min(len(self.good), len(self.bad))} "
                    f"or add examples",
                    path,
                    line,
                )

    @property
    def is_label_task(self) -> bool:
        """Every pool answer is one of the label options and the answers repeat (at most half as many distinct
        answers as pool examples); otherwise the answers are free text."""
        answers = {e.y for e in self.good + self.bad}
        return answers <= set(self.labels) and len(answers) <= (len(self.good) + len(self.bad)) // 2

    def balance_counts(self) -> dict[str, int] | None:
        """How many demos of each set show each label under the balance option (largest remainder); None when the
        sets are not balanced (balance: none, or a free-text task)."""
        if self.balance == "none" or not self.is_label_task:
            return None
        if self.balance == "uniform":
            share = np.full(len(self.labels), 1.0 / len(self.labels))
        else:
            share = np.array([sum(e.y == lab for e in self.good) for lab in self.labels], dtype=np.float64)
            share /= share.sum()
        exact = share * self.N
        counts = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - counts), kind="stable")[: self.N - counts.sum()]:
            counts[i] += 1
        return {lab: int(c) for lab, c in zip(self.labels, counts)}

    def x_part(self, x: str) -> str:
        """The template up to {y}, with x filled in (the end of the scored context)."""
        return self.template.split("{y}", 1)[0].replace("{x}", x)

    def y_part(self, y: str) -> str:
        """The template from {y} on, with y filled in (the scored continuation)."""
        return y + self.template.split("{y}", 1)[1]

    def render(self, example: Example) -> str:
        return self.x_part(example.x) + self.y_part(example.y)

    def demo_text(self, examples: list[Example]) -> str:
        """The header and the demos, each followed by the separator: the context before a candidate's x part."""
        head = self.header + self.separator if self.header else ""
        return head + "".join(self.render(e) + self.separator for e in examples)


def _key_lines(node) -> dict:
    """Line (1-based) of each top-level key of a YAML mapping node, and of each item of its list values."""
    lines = {}
    for key_node, value_node in node.value:
        lines[key_node.value] = key_node.start_mark.line + 1
        if isinstance(value_node, yaml.SequenceNode):
            for i, item in enumerate(value_node.value):
                lines[(key_node.value, i)] = item.start_mark.line + 1
    return lines


def _examples(value, key: str, path: str, lines: dict, labels: list | None) -> list[Example]:
    """The pool `key` (the schema has checked an inline list): a JSONL file's rows are checked here. With the
    task's `labels` given, every answer must be one of them (a typo would make a label task free text)."""
    if isinstance(value, str):
        pool_path = Path(path).parent / value
        numbered = read_jsonl(pool_path, required=("x", "y"), with_lines=True)
        for line, row in numbered:
            check_row("task", row, pool_path, line, definition="example")
        located = [(row, str(pool_path), line) for line, row in numbered]
        if not located:
            raise UserError(f"{key!r} has no examples", path, lines.get(key))
    else:
        located = [(row, path, lines.get((key, i))) for i, row in enumerate(value)]
    known = None if labels is None else {str(v) for v in labels}
    for row, where, line in located:
        if known is not None and row["y"] not in known:
            raise UserError(
                f"{key!r} example answer {row['y']!r} is not among the task's labels "
                f"({', '.join(map(repr, map(str, labels)))}){did_you_mean(row['y'], known)}",
                where,
                line,
            )
    return [Example(row["x"], row["y"]) for row, _, _ in located]


def load_task(path, overrides: dict | None = None) -> Task:
    """Read and check a task YAML; any problem is a one-line UserError naming file:line. `overrides`: settings
    given on the command line (M, N, L, seed, balance, calibrate), checked with the file's (an error about one of
    them names no line)."""
    path = str(path)
    node, data = read_yaml(path, "a task file")  # bounded: size, aliases expanded, depth
    if not isinstance(data, dict):
        raise UserError("a task file is a YAML mapping (name, template, good, bad, ...)", path, 1)
    lines = _key_lines(node)
    for key in data:
        check_text(data[key], repr(key), path, lines.get(key))
    check_yaml("task", data, node, path)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    values = {**DEFAULTS, **data, **overrides}
    template = values["template"]
    if template.count("{x}") != 1 or template.count("{y}") != 1 or template.index("{x}") > template.index("{y}"):
        raise UserError("'template' must contain {x} once and then {y} once", path, lines.get("template"))
    for key in ("M", "N", "L"):
        if values[key] > LIMITS[key]:
            raise UserError(f"{key!r} = {values[key]} is over the limit of {LIMITS[key]}", path, lines.get(key))
    labels = values.get("labels")
    good = _examples(values["good"], "good", path, lines, labels)
    bad = _examples(values["bad"], "bad", path, lines, labels)
    if labels is None:
        labels = sorted({e.y for e in good + bad})
    judge_question = values.get("judge_question")
    if judge_question is not None and judge_question.count("{x}") != 1:
        raise UserError("'judge_question' must contain {x} once", path, lines.get("judge_question"))
    task = Task(
        name=str(values.get("name") or Path(path).stem),
        template=template,
        good=good,
        bad=bad,
        separator=values["separator"],
        header=values["header"],
        labels=[str(v) for v in labels],
        judge_question=judge_question,
        M=values["M"],
        N=values["N"],
        L=values["L"],
        seed=values["seed"],
        balance=values["balance"],
        calibrate=values["calibrate"],
        content_free=values["content_free"],
    )
    where = (None, None) if {"M", "N"} & set(overrides) else (path, lines.get("N", lines.get("M")))
    task.check_ratio_grid(*where)
    task.check_pool_size(*((None, None) if "N" in overrides else (path, lines.get("N"))))
    return task


def task_to_dict(task: Task) -> dict:
    d = asdict(task)
    d["good"], d["bad"] = [[e.x, e.y] for e in task.good], [[e.x, e.y] for e in task.bad]
    return d


def task_from_dict(d: dict) -> Task:
    return Task(**{**d, "good": [Example(*e) for e in d["good"]], "bad": [Example(*e) for e in d["bad"]]})
