"""The state of one ALLURE run on disk, so that a killed run resumes where it stopped: an icqs.run.RunDir (the
run-directory convention of every evaluation command: run.json, a lock, nothing written before the run starts)
with the audit's own logs.

  run.json      the settings the run was started with (a resume with other items, template or model is refused),
                its run_id, and the engine's stats
  stages.jsonl  one row per evaluation pass ("stage"): its name, kind (round, sweep, full, ablation) and the ids
                of the memory's ICL examples shown to the evaluator, fixed when the stage starts
  evals.jsonl   one row per (stage, item): the audited truth, P(label = 1) and the evaluator's label
Metrics are recomputed from these rows; nothing else is kept.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from engine.errors import UserError
from engine.progress import progress_bar
from icqs.io import ResultWriter
from icqs.logs import allure_eval_schema, allure_stage_schema, validator
from icqs.run import RunDir, read_run_json

from .metrics import summarize

# Settings that must not change on resume (the rest, e.g. the number of rounds, may).
FIXED = ("tasks_sha256", "template", "model", "holdout", "seed")
CHUNK = 32  # items per engine call: results are written after each chunk


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class AuditRun(RunDir):
    def __init__(self, out_dir, items: list[dict], settings: dict, progress: bool = True):
        """Checked, nothing written: `start()` creates the folder, run.json and the logs. `progress`: a progress bar
        per stage."""
        settings = {k: v for k, v in settings.items() if k not in ("command", "run_id", "engine_stats")}
        super().__init__(out_dir, "allure", settings, fixed=FIXED, created={"run_id": uuid.uuid4().hex[:12]})
        self.items, self.progress = items, progress

    @classmethod
    def load(cls, run_dir, load_items) -> "AuditRun":
        """An existing run folder (for its report), its items re-read by `load_items(settings)` as the run read
        them."""
        settings = read_run_json(run_dir, "allure")
        return cls(run_dir, load_items(settings), settings, progress=False)

    @property
    def settings(self) -> dict:
        return self.meta

    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    def start(self) -> "AuditRun":
        opened = self._fd is not None
        super().start()
        if not opened:
            self.stages = ResultWriter(
                self.path / "stages.jsonl", key="stage", validate=validator(allure_stage_schema())
            )
            self.evals = ResultWriter(
                self.path / "evals.jsonl", key=("stage", "id"), validate=validator(allure_eval_schema())
            )
        return self

    def _release(self) -> None:
        if self._fd is not None:
            self.stages.close()
            self.evals.close()
        super()._release()

    # ---- stages ----------------------------------------------------------------------------------------------
    def stage(self, name: str) -> dict | None:
        for row in self.stages.rows:
            if row["stage"] == name:
                return row
        return None

    def plan(self, name: str, kind: str, icl_ids: list[int], **meta) -> dict:
        """The stage's row: written now if new, else the one fixed when it first started."""
        row = self.stage(name)
        if row is None:
            row = dict(stage=name, kind=kind, icl_ids=[int(i) for i in icl_ids], **meta)
            self.stages.write(row)
        return row

    def stages_of(self, kind: str) -> list[dict]:
        return [r for r in self.stages.rows if r["kind"] == kind]

    def evaluate(self, evaluator, name: str, turns: list[tuple[str, str]]) -> list[dict]:
        """Label the items not yet labelled in this stage; returns all the stage's rows."""
        todo = [it for it in self.items if not self.evals.done((name, it["id"]))]
        with progress_bar(total=len(todo), desc=name, unit="item", disable=not todo or not self.progress) as bar:
            for start in range(0, len(todo), CHUNK):
                chunk = todo[start : start + CHUNK]
                got = evaluator.label(chunk, turns)
                for it, p, lab in zip(chunk, got.p_correct, got.labels):
                    self.evals.write(
                        dict(
                            stage=name,
                            id=it["id"],
                            split=it["split"],
                            truth=int(it["truth"]),
                            p_correct=round(float(p), 6),
                            label=int(lab),
                        )
                    )
                bar.update(len(chunk))
        return self.rows(name)

    def rows(self, name: str) -> list[dict]:
        order = {it["id"]: i for i, it in enumerate(self.items)}
        got = [r for r in self.evals.rows if r["stage"] == name and r["id"] in order]
        return sorted(got, key=lambda r: order[r["id"]])

    def complete(self, name: str) -> bool:
        return all(self.evals.done((name, it["id"])) for it in self.items)

    # ---- metrics ---------------------------------------------------------------------------------------------
    def metrics(self, name: str) -> dict:
        """summarize() per split ("audit", "holdout") and over all items, plus errors by item group."""
        rows = self.rows(name)
        out = {}
        for split in ("all", "audit", "holdout"):
            sel = [r for r in rows if split == "all" or r["split"] == split]
            if sel:
                out[split] = summarize(
                    [r["truth"] for r in sel], [r["label"] for r in sel], [r["p_correct"] for r in sel]
                )
        groups = {it["id"]: it.get("group") for it in self.items}
        by_group: dict = {}
        for r in rows:
            g = groups.get(r["id"])
            if g is not None and r["truth"] != r["label"]:
                by_group[str(g)] = by_group.get(str(g), 0) + 1
        if by_group:
            out["errors_by_group"] = by_group
        return out


def reread_items(settings: dict) -> list[dict]:
    """The items of a run, re-read as the run read them (the file must not have changed)."""
    from .tasks import load_items
    from .template import template_from_dict

    try:
        tasks, template, holdout, seed = (
            settings["tasks"],
            settings["template"],
            settings["holdout"],
            settings["seed"],
        )
    except KeyError as e:
        raise UserError(f"corrupt run.json (no {e})") from None
    if not Path(tasks).is_file() or file_sha256(tasks) != settings.get("tasks_sha256"):
        raise UserError("the run's items file is gone or has changed since the run", tasks)
    return load_items(tasks, template_from_dict(template, "run.json"), holdout, seed)
