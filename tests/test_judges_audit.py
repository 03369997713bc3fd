"""Pairwise and judge fixes (issue 22, parts 2 and 5): --no-tie, --rubric, labeled variants, the pairwise audit
(flip rates, tie share, a warning when ties dominate), the judge's per-model table and agreement with labels."""

import json

import pytest
from jsonl_files import PAIRS, write_jsonl

from icqs.cli import main
from icqs.judges.pairwise import VARIANTS, verdict_options
from icqs.judges.prompts import pairwise_prompt
from icqs.judges.results import pairwise_audit_table, pairwise_summary


@pytest.fixture(scope="module")
def model(long_tiny_dir):
    return str(long_tiny_dir)


def test_all_ties_warn_instead_of_a_silent_flat_leaderboard():
    """Why: every verdict a tie gave every model 1000.0 [1000.0, 1000.0], rank 1, with no note."""
    tie = {o: (1.0 if o == "tie" else 0.0) for o in ("model_a", "model_b", "tie")}
    rows = [
        {
            "id": p["id"],
            "winner": "model_a",
            "variants": {v.name: tie for v in VARIANTS},
            "verdicts": {v.name: "tie" for v in VARIANTS},
            "aggregate": tie,
            "verdict": "tie",
        }
        for p in PAIRS
    ]
    summary = pairwise_summary(rows)
    warnings = summary["warnings"]
    text = pairwise_audit_table(summary).text()
    assert any(line.startswith("! tie share") and line.split()[3:5] == ["1.00", "-"] for line in text.splitlines())
    assert warnings[0].startswith("warning: ties are 100% of the verdicts") and "--no-tie" in warnings[0]
    assert summary["distrusted"] == ["ties are 100% of the verdicts"]
    assert set(summary["variants"]) == {"AB", "BA", "AB_sym", "BA_sym"}
    assert summary["variants"]["BA"] == "answer_b shown first; answer_a labeled B, answer_b labeled A, tie C"


def test_no_tie_and_rubric_change_the_prompt_and_options():
    assert verdict_options(tie=False) == ["[[A]]", "[[B]]"]
    p = pairwise_prompt("q", "one", "two", ("A", "B"), tie=False, rubric="Prefer the correct sum.")
    assert "[[C]]" not in p and "a tie is not allowed" in p and "Judge by this rubric:\nPrefer the correct sum." in p


def test_pairwise_cli_no_tie_rubric_and_labeled_variants(model, tmp_path, capsys):
    """Why: the `variants` arrays did not say which position is A, B or tie; no way to forbid ties or give a
    rubric."""
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("The answer with the right sum is better.\n")
    out = tmp_path / "run"
    assert (
        main(
            [
                "pairwise",
                write_jsonl(tmp_path / "p.jsonl", PAIRS),
                "--out",
                str(out),
                "--model",
                model,
                "--dtype",
                "float32",
                "--no-tie",
                "--rubric",
                str(rubric),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "verdicts.jsonl").read_text().splitlines()]
    for r in rows:
        for probs in r["variants"].values():
            assert set(probs) == {"model_a", "model_b", "tie"} and probs["tie"] == 0.0
            assert probs["model_a"] + probs["model_b"] == pytest.approx(1.0, abs=1e-4)
        assert r["verdict"] != "tie"
    assert "pairwise bias check: 3 pairs x 4 prompts" in printed
    assert "check                 measured  without bias" in printed and "{" not in printed  # a table, no JSON
    assert json.loads((out / "run.json").read_text())["rubric"] == rubric.read_text()


def test_judge_per_model_table_and_agreement_with_labels(model, tmp_path, capsys):
    """Why: the judge summary had no per-model table and no agreement with reference labels."""
    items = [
        {
            "id": f"{m}{n}",
            "model": m,
            "question": f"What is {n} + {n}?",
            "response": f"It is {2 * n + (0 if m == 'good' else 1)}.",
            "label": int(m == "good"),
        }
        for m in ("good", "bad")
        for n in range(3)
    ]
    out = tmp_path / "run"
    assert (
        main(
            [
                "judge",
                write_jsonl(tmp_path / "j.jsonl", items),
                "--out",
                str(out),
                "--model",
                model,
                "--dtype",
                "float32",
                "--shots",
                "0",
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert {m["model"] for m in summary["by_model"]} == {"good", "bad"} and all(
        m["n"] == 3 for m in summary["by_model"]
    )
    (a,) = summary["agreement"]
    assert a["k"] == 0 and a["n"] == 6 and a["ci"][0] <= a["auc"] <= a["ci"][1]
    assert "judge: per model (rank 1 = the highest mean grade)" in printed.out and "[" != printed.out.lstrip()[0]
    k0 = next(line for line in printed.out.splitlines() if line.lstrip("! ").startswith("0      6"))
    assert f"{a['auc']:.2f}  [{a['ci'][0]:.2f}, {a['ci'][1]:.2f}]  {a['verdict']}" in k0
    assert (a["verdict"] in ("at chance", "inverted")) == ("warning: judge with K=0" in printed.err)
