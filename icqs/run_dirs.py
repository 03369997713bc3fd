"""One contract for the run directories of `icqs score`, `icqs judge`, `icqs pairwise` and `icqs allure run`: what
`icqs leaderboard | audit | report DIR` read from each.

Every run directory has a run.json whose `command` says its kind (icqs.run.RunDir writes it). `open_run(DIR)`
reads it and returns the kind's view, a `RunView`: its `leaderboard()` and `audit()` are `Section`s (the tables as
text, the same as JSON data, and the `warning:` lines), `report(output)` writes its HTML report. A section a kind does
not have (an ALLURE run ranks no models; a judge run whose rows name no models) is a one-line UserError that says
what the run has instead. Every file is read back through its schema (icqs.logs, icqs.contracts), so a damaged
file is a `file:line` error, never a silently different report.

  score     run.json, candidates.jsonl, the methods' logs, audit.json     (icqs.score_run, icqs.report)
  judge     run.json, items.jsonl (the input rows), grades.jsonl           (icqs.judges.results, icqs.report_runs)
  pairwise  run.json, items.jsonl, verdicts.jsonl                          (icqs.judges.results, icqs.report_runs)
  allure    run.json, stages.jsonl, evals.jsonl, the ICL memory, the items file it names  (icqs.allure.report)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.errors import UserError

from .run import read_run_json

KINDS = ("score", "judge", "pairwise", "allure")


@dataclass(frozen=True)
class Section:
    """What `icqs leaderboard` or `icqs audit` shows of a run: `text` for the terminal, `data` for --json, and the
    `warning:` lines (stderr)."""

    text: str
    data: object
    warnings: tuple[str, ...] = ()


class RunView(Protocol):
    kind: str
    path: Path

    def leaderboard(self) -> Section: ...

    def audit(self) -> Section: ...

    def report(self, output: str | None = None) -> Path: ...


def run_kind(path) -> str:
    """The kind of the run directory at `path` (one of KINDS); a one-line UserError for anything else."""
    meta = read_run_json(path)
    kind = meta.get("command")
    if kind not in KINDS:
        raise UserError(
            f"run.json names the command {kind!r}; `icqs report | leaderboard | audit` read runs of {', '.join(KINDS)}",
            str(Path(path) / "run.json"),
        )
    return kind


def open_run(path) -> RunView:
    """The view of an existing run directory, of whichever kind it is."""
    return {"score": ScoreRun, "judge": JudgeRun, "pairwise": PairwiseRun, "allure": AllureRun}[run_kind(path)](
        Path(path)
    )


# ---- score -----------------------------------------------------------------------------------------------------------
@dataclass
class ScoreRun:
    path: Path
    kind = "score"
    partial: bool = False  # `icqs leaderboard --partial`: rank the complete methods when some lack results

    def leaderboard(self) -> Section:
        from .score_run import check_complete, load_scores

        task, _, rows, meta = load_scores(self.path)
        partial = check_complete(meta, self.path, self.partial)  # a method with missing rows is named, not dropped
        if not rows:
            raise UserError("no method has complete results yet; run `icqs score` again to finish", str(self.path))
        return self.leaderboard_of(task, rows, meta, partial)

    def leaderboard_of(self, task, rows: list[dict], meta: dict, partial: str | None = None) -> Section:
        """The headline (icqs.headline), the audit, then the leaderboards of these score rows (a run that just
        computed them passes them on); leaderboard.txt and leaderboard.json are (re)written."""
        from .headline import format_headline
        from .run_files import read_run_file
        from .score_run import run_headline, write_leaderboard

        audit = self._audit(task, meta)
        head = run_headline(self.path, rows, task, meta)
        text = write_leaderboard(self.path, rows, task, meta.get("engine_stats"), head, partial)
        boards = read_run_file(self.path / "leaderboard.json")
        return Section(
            f"{format_headline(head)}\n{audit.text}\n{text}",
            {"kind": self.kind, "headline": head, "audit": audit.data["audit"], "leaderboards": boards},
            audit.warnings,
        )

    def audit(self) -> Section:
        from .score_run import load_scores

        return self._audit(load_scores(self.path)[0], read_run_json(self.path, "score"))

    def _audit(self, task, meta: dict) -> Section:
        from .audit import audit_share, format_audit, warnings
        from .audit_state import audit_status

        status = audit_status(self.path, meta)  # pending, done, skipped or off (run.json), and audit.json checked
        note = status.describe()
        missing = (
            ()
            if status.complete or status.state == "off" or status.state.startswith("skipped")
            else ("warning: this run's evaluator audit is missing or incomplete; its leaderboard marks are pending",)
        )
        if status.entries is None:
            return Section(note, {"kind": self.kind, "audit": None, "audit_state": status.state}, missing)
        return Section(
            format_audit(status.entries, task, audit_share(meta)) + (f"\n{note}" if note else ""),
            {"kind": self.kind, "audit": status.entries, "audit_state": status.state},
            missing + tuple(warnings(status.entries)),
        )

    def report(self, output: str | None = None) -> Path:
        from .report import write_report

        return write_report(self.path, output)


def _read_json(path: Path):
    import json

    return json.loads(path.read_text(encoding="utf-8"))


# ---- judge and pairwise ----------------------------------------------------------------------------------------------
def read_items(run_dir: Path, schema: str) -> list[dict]:
    """items.jsonl of a judge or pairwise run: the input rows as the run read them, each checked against the input's
    schema (`icqs schema judge | pairwise`), ids unique."""
    from .contracts import check_row
    from .io import read_jsonl

    path = run_dir / "items.jsonl"
    if not path.is_file():
        raise UserError(
            f"no items.jsonl (a run of an earlier version); run the same `icqs {schema}` command again "
            f"with this --out to add it (finished results are kept)",
            str(run_dir),
        )
    items, seen = [], set()
    for line, row in read_jsonl(path, with_lines=True):
        check_row(schema, row, path, line)
        if str(row.get("id")) in seen:
            raise UserError(f"duplicate id {row.get('id')!r}", str(path), line)
        seen.add(str(row.get("id")))
        items.append({**row, "id": str(row.get("id"))})
    return items


def read_logged(run_dir: Path, kind: str, log: str, schema: dict) -> tuple[dict, list[dict], list[dict]]:
    """run.json, the items and the result log `log` (each row checked against `schema`) of a judge or pairwise run:
    the log's rows of those items, in the items' order, their ids as the items' (strings)."""
    from .io import read_results
    from .logs import validator

    meta = read_run_json(run_dir, kind)
    items = read_items(run_dir, kind)
    order = {it["id"]: n for n, it in enumerate(items)}
    rows = [{**r, "id": str(r["id"])} for r in read_results(run_dir / log, validator(schema)) if str(r["id"]) in order]
    if not rows:
        raise UserError(f"no results yet ({log} is empty or missing); run `icqs {kind}` again to finish", str(run_dir))
    return meta, items, sorted(rows, key=lambda r: order[r["id"]])


@dataclass
class LoggedRun:
    """A judge or pairwise run as read back: run.json, the items, the result rows and their summary."""

    path: Path
    meta: dict = field(init=False)
    items: list = field(init=False)
    rows: list = field(init=False)
    summary: dict = field(init=False)


@dataclass
class JudgeRun(LoggedRun):
    kind = "judge"

    def __post_init__(self):
        from .judges.results import judge_summary
        from .logs import grades_schema

        self.meta, self.items, self.rows = read_logged(self.path, "judge", "grades.jsonl", grades_schema())
        self.summary = {
            "kind": self.kind,
            "method": self.meta.get("method"),
            "per_item_draws": self.meta.get("per_item_draws"),
            **judge_summary(self.items, self.rows),
        }

    def leaderboard(self) -> Section:
        from .judges.results import judge_model_table

        table = judge_model_table(self.summary)
        if table is None:
            raise UserError(
                "this judge run ranks no models: its input rows name none (a `model` field); "
                "`icqs audit DIR` shows its grades per K, `icqs report DIR` every item",
                str(self.path),
            )
        return Section(
            table.text(), {"kind": self.kind, "by_model": self.summary["by_model"]}, tuple(self.summary["warnings"])
        )

    def audit(self) -> Section:
        from .judges.results import judge_audit_tables

        tables = judge_audit_tables(self.summary)
        return Section(
            "\n\n".join(t.text() for t in tables),
            {
                "kind": self.kind,
                **{k: self.summary[k] for k in ("by_k", "agreement", "consistency") if k in self.summary},
            },
            tuple(self.summary["warnings"]),
        )

    def report(self, output: str | None = None) -> Path:
        from .report_runs import judge_report

        return judge_report(self, output)


@dataclass
class PairwiseRun(LoggedRun):
    kind = "pairwise"

    def __post_init__(self):
        from .judges.results import pairwise_summary
        from .logs import verdicts_schema

        self.meta, self.items, self.rows = read_logged(self.path, "pairwise", "verdicts.jsonl", verdicts_schema())
        bootstrap, seed = self.meta.get("bootstrap", 200), self.meta.get("seed", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= lo for v, lo in ((bootstrap, 1), (seed, 0))):
            raise UserError(
                "corrupt run.json (its bootstrap or seed is not what `icqs pairwise` writes); remove the "
                "run directory to start over",
                str(self.path / "run.json"),
            )
        self.summary = {
            "kind": self.kind,
            "tie": self.meta.get("tie", True),
            **pairwise_summary(self.rows, bootstrap, seed),
        }

    def leaderboard(self) -> Section:
        from .judges.results import pairwise_leaderboard_table

        table = pairwise_leaderboard_table(self.summary)
        if table is None:
            raise UserError(
                "this pairwise run ranks no models: not every input row names its two models "
                "(model_a, model_b); `icqs audit DIR` shows the judge's bias check",
                str(self.path),
            )
        return Section(
            table.text(),
            {"kind": self.kind, "leaderboard": self.summary["leaderboard"], "distrusted": self.summary["distrusted"]},
            tuple(self.summary["warnings"]),
        )

    def audit(self) -> Section:
        from .judges.results import pairwise_audit_table

        return Section(
            pairwise_audit_table(self.summary).text(),
            {
                "kind": self.kind,
                "bias": self.summary["logprob"]["bias"],
                **self.summary["audit"],
                "distrusted": self.summary["distrusted"],
            },
            tuple(self.summary["warnings"]),
        )

    def report(self, output: str | None = None) -> Path:
        from .report_runs import pairwise_report

        return pairwise_report(self, output)


# ---- allure ----------------------------------------------------------------------------------------------------------
@dataclass
class AllureRun:
    path: Path
    kind = "allure"

    def leaderboard(self) -> Section:
        raise UserError(
            "an ALLURE run audits one evaluator and ranks no models: `icqs audit DIR` shows the "
            "evaluator per round, `icqs report DIR` the full report",
            str(self.path),
        )

    def _open(self):
        """The run (icqs.allure.run_dir.AuditRun, not started), its items re-read as the run read them (the items
        file must be unchanged), and its ICL memory present."""
        from .allure.run_dir import AuditRun, reread_items

        run = AuditRun.load(self.path, reread_items)
        if not Path(run.settings.get("memory", "")).is_file():
            raise UserError("the run's ICL memory is gone", run.settings.get("memory"))
        return run

    def audit(self) -> Section:
        from .allure.memory import Memory
        from .allure.report import rounds_table, summary

        run = self._open()
        with run.start(), Memory(run.settings["memory"]) as mem:
            s = summary(run, mem)
        warnings = tuple(f"warning: round {r['round']}: {w}" for r in s["rounds"] for w in r.get("warnings", []))
        return Section(
            rounds_table(s["rounds"]).text(),
            {"kind": self.kind, "rounds": s["rounds"], "memory": s["memory"]},
            warnings,
        )

    def report(self, output: str | None = None) -> Path:
        """report.html (or `output`) and summary.json, as `icqs allure run` writes them."""
        from .allure.memory import Memory
        from .allure.report import write_report

        run = self._open()
        with run.start(), Memory(run.settings["memory"]) as mem:
            return write_report(run, mem, Path(output) if output else None)[0]
