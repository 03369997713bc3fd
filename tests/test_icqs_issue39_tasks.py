"""benchmarks/icqs_issue39_tasks.py: the label tasks of issue 39's before/after table are auditable. A 3-way task
whose labels are skewed (as BIG-bench presuppositions_as_nli is) must give every fold of the label-stratified audit
every label on both sides, or the label-balanced demo sets cannot be drawn and the audit skips every method."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from icqs.audit import folds
from icqs.sampler import demo_sets
from icqs.task import load_task

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("icqs_issue39_tasks", ROOT / "benchmarks" / "icqs_issue39_tasks.py")
tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tasks)

LABELS = ["contradiction", "entailment", "neutral"]


def skewed_rows(n: int = 60) -> list[tuple[str, str]]:
    """Premise/hypothesis rows, half entailment, a third contradiction, a sixth neutral."""
    share = ["entailment"] * 3 + ["contradiction"] * 2 + ["neutral"]
    return [(f"Premise {i}. Hypothesis {i}.", share[i % len(share)]) for i in range(n)]


def write(tmp_path: Path, task: dict, cands: list[dict]) -> Path:
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    (tmp_path / "candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cands))
    return tmp_path / "task.yaml"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_label_the_same_share_of_each_pool_and_of_the_questions(seed):
    task, cands = tasks.build_from_rows("nli", "Label each pair.", "{x}\nAnswer: {y}", skewed_rows(), LABELS, seed)
    for side in ("good", "bad"):
        assert Counter(e["y"] for e in task[side]) == {lab: 4 for lab in LABELS}, side
    for e in task["bad"]:  # a bad answer shows a wrong label: its question's right label is another one
        assert e["y"] in LABELS
    right = Counter(c["y"] for c in cands if c["model"] == "model-A" and c["truth"] == 1)
    questions = {c["x"] for c in cands}
    assert len(questions) == 12 and not questions & {e["x"] for e in task["good"] + task["bad"]}
    assert sum(c["truth"] for c in cands) == 11 + 8 + 5 + 2 and sum(right.values()) == 11


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_audit_fold_draws_label_balanced_demo_sets(tmp_path, seed):
    task = load_task(
        write(
            tmp_path, *tasks.build_from_rows("nli", "Label each pair.", "{x}\nAnswer: {y}", skewed_rows(), LABELS, seed)
        )
    )
    for draw in range(3):
        for train, _held in folds(task, draw):
            assert {e.y for e in train.bad} == set(LABELS) and {e.y for e in train.good} == set(LABELS)
            demo_sets(train, "coupled")  # raises where a fold's pool lacks a label


def test_too_few_rows_is_an_error():
    with pytest.raises(ValueError, match="too few examples"):
        tasks.pools(skewed_rows(30), LABELS)


def test_the_table_reads_a_run_directory(tmp_path):
    """benchmarks/icqs_issue39_table.py: the audit as the run wrote it, the truth AUC recomputed from scores.jsonl, the
    leaderboard's Spearman, the headline's measure in bold and a reliable measure the family bound refuses said so."""
    spec = importlib.util.spec_from_file_location("icqs_issue39_table", ROOT / "benchmarks" / "icqs_issue39_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    run = tmp_path / "run"
    run.mkdir()
    cands = [
        {"id": f"m{m}/q{q}", "model": f"m{m}", "x": f"q{q}", "y": "a", "truth": int(q < 2 - m)}
        for m in range(2)
        for q in range(4)
    ]
    (run / "candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cands))
    (run / "scores.jsonl").write_text(
        "".join(
            json.dumps(
                {"method": "loglik", "draw": 0, "id": c["id"], "truth": c["truth"], "score": c["truth"] + 0.1 * k}
            )
            + "\n"
            for k, c in enumerate(cands)
        )
    )
    audit = [
        {
            "method": "loglik",
            "measure": "score",
            "auc": 0.9,
            "ci": [0.7, 1.0],
            "verdict": "reliable",
            "family": 5,
            "ci_family": [0.45, 1.0],
        },
        {"method": "icqs", "measure": "score", "auc": 0.5, "ci": [0.3, 0.7], "verdict": "at chance"},
    ]
    (run / "audit.json").write_text(json.dumps(audit))
    (run / "leaderboard.json").write_text(json.dumps([{"method": "loglik", "measures": {"score": {"spearman": 1.0}}}]))
    (run / "run.json").write_text(
        json.dumps(
            {
                "headline": {"method": "loglik", "measure": "score", "text": ["Best"]},
                "audit_stats": {"loglik": {"tokens_computed": 70, "seconds": 1.0}},
                "engine_stats": {"loglik": {"tokens_computed": 30, "seconds": 1.0}},
            }
        )
    )
    rows = table.rows_of(run)
    assert rows[0].startswith("| | **loglik score (headline)** | 0.90 [0.70, 1.00] | 1.00 [")
    assert rows[0].endswith("| +1.00 | reliable (not with the 5 compared) |")
    assert rows[1].startswith("| | icqs score | 0.50 [0.30, 0.70] | - | - | at chance")
    assert "audit 70% of 100 tokens computed" in rows[2] and rows[-1] == "  headline: Best"
