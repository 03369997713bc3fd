"""ALLURE loop on a tiny random model: round bookkeeping, memory growth from audit errors, resume after a kill,
human review, convergence, the ICL-size sweep and the cluster ablation with an injected embedding."""

import json

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score, roc_auc_score

from engine import Engine
from engine.errors import UserError
from icqs.allure.ablation import ablation_rows, cluster_ablation, icl_sweep, sweep_rows
from icqs.allure.evaluator import Evaluator
from icqs.allure.failure_modes import failure_modes, tag_memory
from icqs.allure.loop import iterate, round_table, shown_examples
from icqs.allure.memory import Memory
from icqs.allure.run_dir import AuditRun
from icqs.allure.tasks import load_items
from icqs.allure.template import template_from_dict

TEMPLATE = template_from_dict(dict(name="short", system="Grade.", user="R: {response}\nA: {answer}"))


def write_items(path, n=10):
    rows = []
    for i in range(n):
        answer = 3 + i
        response = f"it is {answer}" if i % 3 == 0 else f"it is {answer + 1 + i}"
        rows.append(dict(id=f"q{i}", response=response, answer=f"{answer} cats", group="even" if i % 2 else "odd"))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)


def open_run(tmp_path, holdout=0.3, **extra):
    items = load_items(tmp_path / "items.jsonl", TEMPLATE, holdout=holdout, seed=0)
    settings = dict(tasks_sha256="x", template=TEMPLATE.to_dict(), model="tiny", holdout=holdout, seed=0, **extra)
    return AuditRun(tmp_path / "run", items, settings).start(), Memory(tmp_path / "mem.sqlite")


def test_rounds_grow_memory_from_audit_errors(tmp_path, engine):
    write_items(tmp_path / "items.jsonl")
    run, mem = open_run(tmp_path)
    assert sum(it["split"] == "holdout" for it in run.items) == 3
    out = iterate(run, Evaluator(engine, TEMPLATE), mem, rounds=2)
    r1 = run.rows("round-1")
    assert run.stage("round-1")["icl_ids"] == [] and len(r1) == len(run.items)
    audit_errors = [r for r in r1 if r["split"] == "audit" and r["truth"] != r["label"]]
    added = mem.examples(run_id=run.run_id, round=1)
    assert [e.item_id for e in added] == [r["id"] for r in audit_errors]  # one example per audit error, no holdout
    for e, r in zip(added, audit_errors):
        assert e.correct_label == r["truth"] and e.evaluator_label == r["label"] and e.status == "accepted"
        assert e.error_kind == ("false_positive" if r["label"] == 1 else "false_negative")
        assert e.assistant_text == f"label: {r['truth']}" and e.user_text.startswith("R: ")
        assert e.provenance["stage"] == "round-1"
    if out.status == "done":
        assert run.stage("round-2")["icl_ids"] == [e.id for e in added]
    else:  # round 1 made no audit error: nothing to learn, so the loop stops
        assert out.status == "converged" and not added
    table = round_table(run, mem)
    assert table[0]["round"] == 1 and table[0]["n_icl"] == 0 and table[0]["new_examples"] == len(added)
    y, p, s = [r["truth"] for r in r1], [r["label"] for r in r1], [r["p_correct"] for r in r1]
    assert table[0]["all"]["f1"] == pytest.approx(f1_score(y, p, zero_division=0))
    assert table[0]["all"]["auc"] == pytest.approx(roc_auc_score(y, s))
    assert table[0]["all"]["errors"] == sum(a != b for a, b in zip(y, p))
    assert sum(table[0]["errors_by_group"].values()) == table[0]["all"]["errors"]
    assert table[0]["audit"]["n"] + table[0]["holdout"]["n"] == len(run.items)


def test_resume_after_kill_redoes_nothing_finished(tmp_path, engine):
    write_items(tmp_path / "items.jsonl", n=12)
    run, mem = open_run(tmp_path, holdout=0.0)
    ev = Evaluator(engine, TEMPLATE)
    iterate(run, ev, mem, rounds=2)
    full = {(r["stage"], r["id"]): r["label"] for r in run.evals.rows}
    run.close()
    path = tmp_path / "run" / "evals.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:15]) + lines[15][:20])  # killed in the middle of round 2, mid-line
    run, mem = open_run(tmp_path, holdout=0.0)
    assert len(run.evals) == 15
    calls = []
    ev.label = (lambda f: lambda items, turns: calls.append(len(items)) or f(items, turns))(ev.label)
    iterate(run, ev, mem, rounds=2)
    assert sum(calls) == 2 * 12 - 15  # only the unfinished items were labelled again
    assert {(r["stage"], r["id"]): r["label"] for r in run.evals.rows} == full
    errors = [r for r in run.rows("round-1") if r["truth"] != r["label"]]
    assert len(mem.examples(run_id=run.run_id, round=1)) == len(errors)  # the re-run audit added no duplicates


def test_other_settings_are_refused_on_resume(tmp_path):
    write_items(tmp_path / "items.jsonl")
    run, _ = open_run(tmp_path)
    run.close()
    with pytest.raises(UserError, match="holdout"):
        open_run(tmp_path, holdout=0.5)


def test_review_gates_examples_and_rejection_converges(tmp_path, engine):
    write_items(tmp_path / "items.jsonl")
    run, mem = open_run(tmp_path, holdout=0.0)
    ev = Evaluator(engine, TEMPLATE)
    out = iterate(run, ev, mem, rounds=3, review=True)
    pending = mem.examples(status="pending")
    assert pending, "the tiny model makes some audit error on these items"
    assert out.status == "review" and out.rounds == 1 and run.stage("round-2") is None
    assert mem.accepted() == []
    for e in pending:
        mem.review(e.id, "rejected")
    out = iterate(run, ev, mem, rounds=3, review=True)
    assert out.status == "converged" and run.stage("round-2") is None  # same (empty) ICL set: nothing to re-run
    run2, mem2 = AuditRun(tmp_path / "run2", run.items, dict(run.settings)).start(), mem
    # a fresh run sharing the memory: accepted examples are shown from its first round
    mem2.review(pending[0].id, "accepted")
    iterate(run2, ev, mem2, rounds=1, review=True)
    assert run2.stage("round-1")["icl_ids"] == [pending[0].id]


def test_sweep_and_cluster_ablation(tmp_path, engine):
    write_items(tmp_path / "items.jsonl", n=14)
    run, mem = open_run(tmp_path, holdout=0.0)
    ev = Evaluator(engine, TEMPLATE)
    iterate(run, ev, mem, rounds=1)
    ids = shown_examples(mem)
    assert len(ids) >= 4, "the tiny model makes enough audit errors on these items"
    icl_sweep(run, ev, mem, ids, [0, 2, 100])
    rows = sweep_rows(run)
    assert [r["n"] for r in rows] == [0, 2, len(ids)]
    two = run.stage(f"icl-2-of-{len(ids)}")["icl_ids"]
    assert len(two) == 2 and set(two) <= set(ids) and two == sorted(two, key=ids.index)

    def embed(texts):  # a small deterministic embedding: digit counts
        return np.array([[t.count(d) for d in "0123456789"] for t in texts], dtype=float)

    modes = failure_modes(mem.examples(ids=ids), embed, k=2, seed=0)
    assert sorted(set(modes["cluster"])) == [0, 1] and len(modes["xy"]) == len(ids)
    tag_memory(mem, modes)
    assert all(mem.get(i).failure_mode.startswith("cluster ") for i in ids)
    cluster_ablation(run, ev, mem, ids, modes)
    rows = ablation_rows(run, modes)
    assert rows[0]["cluster"] is None and rows[0]["kappa"] == 1.0
    full = [r["label"] for r in run.rows(f"icl-{len(ids)}-of-{len(ids)}")]
    for row in rows[1:]:
        assert row["removed"] == modes["cluster"].count(row["cluster"])
        ablated = [r["label"] for r in run.rows(row["stage"])]
        expected = cohen_kappa_score(ablated, full) if len(set(ablated) | set(full)) > 1 else 1.0
        assert row["kappa"] == pytest.approx(expected)
        kept = run.stage(row["stage"])["icl_ids"]
        assert not set(kept) & {i for i, c in zip(modes["ids"], modes["cluster"]) if c == row["cluster"]}
