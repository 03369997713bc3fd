"""The evaluator audit and the demo-draw uncertainty (issue 22, part 2)."""

import json

import numpy as np
import pytest
from jsonl_files import write_label_task

from icqs.aggregate import format_leaderboards, leaderboard
from icqs.audit import auc, folds, format_audit, two_level_ci, verdict, warnings
from icqs.cli import main
from icqs.task import Example, Task


def _task(n=12, N=2):
    good = [Example(f"g{i}", ["no", "yes"][i % 2]) for i in range(n)]
    bad = [Example(f"b{i}", ["no", "yes"][(i + 1) % 2]) for i in range(n)]
    return Task("t", "Q: {x}\nA: {y}", good, bad, labels=["no", "yes"], M=2, N=N, L=1)


def test_auc_ci_and_verdicts():
    truths = np.array([1] * 8 + [0] * 8)
    separated = np.where(truths == 1, 1.0, 0.0) + np.linspace(0, 0.1, 16)
    assert auc(separated, truths) == 1.0 and auc(-separated, truths) == 0.0
    assert auc(np.zeros(16), truths) == 0.5  # a constant score (plain ICL's zeros) is at chance, not "0"
    lo, hi = two_level_ci(np.stack([separated, separated]), truths)
    assert lo == hi == 1.0 and verdict(1.0, (lo, hi)) == "reliable"
    assert verdict(0.5, (0.3, 0.7)) == "at chance" and verdict(0.2, (0.1, 0.4)) == "inverted"
    assert verdict(0.62, (0.52, 0.72)) == "weak"
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(3, 16))
    lo, hi = two_level_ci(noise, truths)
    assert lo < 0.5 < hi


def test_folds_hold_every_pool_item_out_once_and_train_on_the_rest():
    task = _task()
    for draw in range(2):
        held = []
        for train, cands in folds(task, draw):
            xs = {c.x for c in cands}
            assert not xs & {e.x for e in train.good + train.bad}  # never its own demo
            assert len(train.good) >= task.N and len(train.bad) >= task.N and train.seed == task.seed + draw
            held += [(c.x, c.truth) for c in cands]
        assert sorted(held) == sorted([(e.x, 1.0) for e in task.good] + [(e.x, 0.0) for e in task.bad])


def test_bad_verdicts_warn_and_mark_the_leaderboard():
    """Why: the embedded model ranked three models exactly backwards and nothing said the evaluator was at
    chance; now the audit's verdict prints a warning and the leaderboard marks that measure's cells."""
    entries = [
        {
            "method": "icqs",
            "measure": "expected",
            "auc": 0.51,
            "ci": [0.38, 0.64],
            "n": 24,
            "draws": 3,
            "folds": 3,
            "auc_draws": [0.5, 0.55, 0.48],
            "label_auc": 0.87,
            "label_bias": True,
            "verdict": "at chance",
        },
        {
            "method": "icqs",
            "measure": "score",
            "auc": 0.9,
            "ci": [0.8, 0.97],
            "n": 24,
            "draws": 3,
            "folds": 3,
            "auc_draws": [0.9, 0.9, 0.9],
            "label_auc": 0.5,
            "verdict": "reliable",
        },
    ]
    said = warnings(entries)
    assert said[0] == (
        "warning: icqs E[r]: no evidence that it tells right from wrong on 24 pool answers (audit AUC "
        "0.51 [0.38, 0.64], the CI includes 0.5); its leaderboard rows (marked !) are not evidence"
    )
    assert said[1].startswith("warning: icqs E[r]: its score follows the answer's label (label AUC 0.87)")
    assert len(said) == 2
    text = format_audit(entries)
    assert "0.51 [0.38, 0.64]" in text and "at chance" in text and "tracks which label" in text
    rows = [
        {"method": "icqs", "model": m, "id": f"{m}{q}", "truth": None, "score": s, "expected": s}
        for m, s in (("a", 0.9), ("b", 0.2))
        for q in range(3)
    ]
    board = format_leaderboards([leaderboard(rows, "icqs")], flags={("icqs", "expected"): "at chance"})
    row_a = next(line for line in board.splitlines() if line.startswith("a "))
    assert row_a.rstrip().endswith("#1 !") and "! E[r]: the audit found this measure at chance" in board


def test_draws_widen_the_ci_and_flips_are_reported():
    """Why: the leaderboard's CIs bootstrapped questions only, hiding which demos were drawn (a held-out run gave
    AUC .67 with one seed and .34 with another)."""
    rng = np.random.default_rng(1)
    rows = []
    for d, shift in enumerate((0.3, -0.3, 0.0)):  # the draw moves model a above or below b
        for m, base in (("a", 0.5 + shift), ("b", 0.5)):
            rows += [
                {
                    "method": "icqs",
                    "draw": d,
                    "model": m,
                    "id": f"{m}{q}",
                    "truth": None,
                    "score": base + 0.05 * rng.normal(),
                    "expected": base,
                }
                for q in range(20)
            ]
    board = leaderboard(rows, "icqs")
    a = next(m for m in board["measures"]["score"]["models"] if m["model"] == "a")
    q_low, q_high = a["ci_questions"]
    assert a["ci_high"] - a["ci_low"] > 3 * (q_high - q_low)  # the draws dominate
    assert len(a["draw_means"]) == 3 and board["measures"]["score"]["draws"]["flips"]
    text = format_leaderboards([board])
    assert "the ranking FLIPS between draws" in text and "CIs over 3 demo draws" in text


@pytest.fixture()
def files(tmp_path):
    return write_label_task(tmp_path)


def test_score_writes_prints_and_reprints_the_audit(files, tiny_model_dir, capsys):
    out = files / "run"
    args = [
        "score",
        str(files / "task.yaml"),
        str(files / "c.jsonl"),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--dtype",
        "float32",
        "--method",
        "icqs",
        "epistemic",
        "--draws",
        "2",
    ]
    assert main(args) == 0
    printed = capsys.readouterr()
    entries = json.loads((out / "audit.json").read_text())
    assert [(e["method"], e["measure"]) for e in entries] == [
        ("icqs", "score"),
        ("icqs", "expected"),
        ("epistemic", "score"),
        ("epistemic", "expected"),
    ]
    for e in entries:
        assert {"method", "measure", "auc", "ci", "n", "label_auc", "verdict"} <= set(e)
        assert e["n"] == 16 and e["draws"] == 2 and len(e["auc_draws"]) == 2
        assert e["ci"][0] <= e["auc"] <= e["ci"][1] and 0 <= e["label_auc"] <= 1
        flagged = e["verdict"] in ("at chance", "inverted")
        assert flagged == (
            f"warning: {e['method']} " in printed.err
            and any(line.startswith(f"warning: {e['method']}") for line in printed.err.splitlines())
        )
    assert printed.out.index("evaluator audit") < printed.out.index("ICQS leaderboard")
    meta = json.loads((out / "run.json").read_text())
    assert set(meta["audit_stats"]) == {"icqs", "epistemic"} and "audit cost:" in printed.out
    assert main(["audit", str(out)]) == 0
    again = capsys.readouterr().out
    start = printed.out.index("evaluator audit")
    assert again.strip() == printed.out[start : printed.out.index("ICQS leaderboard")].strip()


def test_no_audit_skips_it(files, tiny_model_dir, capsys):
    out = files / "run"
    assert (
        main(
            [
                "score",
                str(files / "task.yaml"),
                str(files / "c.jsonl"),
                "--out",
                str(out),
                "--model",
                str(tiny_model_dir),
                "--method",
                "icqs",
                "--draws",
                "1",
                "--no-audit",
            ]
        )
        == 0
    )
    assert not (out / "audit.json").exists() and not list(out.glob("audit_*"))
    assert "ran with --no-audit" in capsys.readouterr().out


def test_evaluation_commands_run_the_engine_deterministically_by_default(files, tiny_model_dir, monkeypatch):
    """Why: in bf16, adding --calibrate moved raw log-likelihoods by up to 0.11 nats (batch composition); the
    evaluation commands now load the engine in its deterministic (batch-invariant) mode unless told otherwise."""
    from engine import Engine

    seen = []
    real = Engine.load.__func__
    monkeypatch.setattr(
        Engine, "load", classmethod(lambda cls, *a, **kw: seen.append(kw["deterministic"]) or real(cls, *a, **kw))
    )
    logs = []
    for extra in ([], ["--calibrate"], ["--nondeterministic"]):
        out = files / f"run{len(logs)}"
        assert (
            main(
                [
                    "score",
                    str(files / "task.yaml"),
                    str(files / "c.jsonl"),
                    "--out",
                    str(out),
                    "--model",
                    str(tiny_model_dir),
                    "--dtype",
                    "bfloat16",
                    "--method",
                    "icqs",
                    "--draws",
                    "1",
                    "--no-audit",
                    "--quiet",
                    *extra,
                ]
            )
            == 0
        )
        logs.append({r["id"]: r["loglik"] for r in map(json.loads, (out / "loglik.jsonl").read_text().splitlines())})
    assert seen == [True, True, False] and logs[0] == logs[1]


def test_the_content_free_input_is_named_and_settable(files, tiny_model_dir, capsys):
    """Why: --calibrate fell back to the content-free input "N/A" without saying so."""
    task = json.loads((files / "task.yaml").read_text())
    (files / "task.yaml").write_text(json.dumps({**task, "content_free": "[nothing]"}))
    assert (
        main(
            [
                "score",
                str(files / "task.yaml"),
                str(files / "c.jsonl"),
                "--out",
                str(files / "run"),
                "--model",
                str(tiny_model_dir),
                "--method",
                "icqs",
                "--draws",
                "1",
                "--no-audit",
                "--calibrate",
            ]
        )
        == 0
    )
    assert "after the content-free input '[nothing]' (task key content_free)" in capsys.readouterr().out
