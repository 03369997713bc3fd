"""One run-directory contract (icqs/run_dirs.py): `icqs report | leaderboard | audit DIR` on score, judge, pairwise
and ALLURE runs, tables on the terminal, `--json` documents that parse, `--quiet` that prints nothing but warnings
and errors; the judge table's CIs and truth column, and a pairwise ranking its own bias check distrusts, marked."""

import json
import math

import pytest
from jsonl_files import write_jsonl
from test_icqs_cli import TASK
from test_icqs_runs import ALLURE_TEMPLATE, PAIRS, commands

from icqs.cli import main
from icqs.judges.results import (
    judge_summary,
    mean_ci,
    pairwise_audit_table,
    pairwise_leaderboard_table,
    pairwise_summary,
    share_ci,
)
from icqs.run_tables import Table

KINDS = ("score", "judge", "pairwise", "allure")
JUDGE_ITEMS = [
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One finished run directory of each kind, on a tiny random model (2048 positions)."""
    from tiny_models import make_tiny_model

    root = tmp_path_factory.mktemp("run_dirs")
    model = make_tiny_model(root / "llama", max_position_embeddings=2048)
    (root / "task.yaml").write_text(TASK)
    write_jsonl(
        root / "c.jsonl",
        [
            {"id": f"{m}{i}", "model": m, "x": x, "y": y, "truth": float(m == "good")}
            for m, answers in (("good", ["yes", "no"]), ("bad", ["no", "yes"]))
            for i, (x, y) in enumerate(zip(["four", "five"], answers))
        ],
    )
    write_jsonl(root / "items.jsonl", JUDGE_ITEMS)
    write_jsonl(root / "pairs.jsonl", PAIRS)
    write_jsonl(
        root / "allure.jsonl", [dict(id=f"a{i}", response=f"so {i + (i % 2)}", answer=str(i)) for i in range(6)]
    )
    (root / "short.yaml").write_text(ALLURE_TEMPLATE)
    dirs = {}
    for kind in KINDS:
        dirs[kind] = root / kind
        argv = commands(root, model, dirs[kind])[kind]
        assert main(argv + (["--quiet"] if kind == "allure" else [])) == 0, kind
    return {"dirs": dirs, "model": model, "root": root}


def _clean_quiet_stderr(err: str) -> None:
    """--quiet: at most `warning:` lines on stderr (no progress bars, no informational lines)."""
    assert all(line.startswith("warning: ") for line in err.splitlines()), err


@pytest.mark.parametrize("kind", KINDS)
def test_report_on_every_run_type(kind, runs, tmp_path, capsys):
    out = tmp_path / f"{kind}.html"
    assert main(["report", str(runs["dirs"][kind]), "--output", str(out)]) == 0
    assert capsys.readouterr().err.strip() == f"wrote {out}"
    page = out.read_text()
    assert page.startswith("<!") and page.rstrip().endswith("</html>") and "<img" in page
    title = {
        "score": "ICQS report",
        "judge": "Judge report",
        "pairwise": "Pairwise report",
        "allure": "ALLURE audit of the evaluator",
    }[kind]
    assert title in page
    if kind == "judge":  # grades with CIs beside the labels' truth, every item
        assert "<th>AUC vs labels</th>" in page and "<th>truth</th>" in page and page.count("<th>95% CI</th>") >= 3
        assert all(f"<td>{it['id']}</td>" in page for it in JUDGE_ITEMS)
    if kind == "pairwise":
        assert "<th>measured</th><th>without bias</th>" in page and "Per pair" in page and "<th>rank</th>" in page
    assert main(["report", str(runs["dirs"][kind]), "--output", str(out), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("kind", KINDS)
def test_leaderboard_and_audit_or_what_the_run_lacks(kind, runs, capsys):
    run = str(runs["dirs"][kind])
    code = main(["leaderboard", run])
    printed = capsys.readouterr()
    if kind == "allure":  # an ALLURE run audits one evaluator: no ranking of models, and it says where to look
        assert code == 2 and printed.out == ""
        assert (
            printed.err.startswith(
                f"error: {run}: an ALLURE run audits one evaluator and ranks no models: `icqs audit DIR`"
            )
            and printed.err.count("\n") == 1
        )
    else:
        assert code == 0 and "{" not in printed.out  # a table, not JSON
        assert {"score": "ICQS leaderboard", "judge": "judge: per model", "pairwise": "pairwise leaderboard"}[
            kind
        ] in printed.out
    assert main(["audit", run]) == 0
    text = capsys.readouterr().out
    assert {
        "score": "AUC",
        "judge": "judge: grades per number of demos (K)",
        "pairwise": "pairwise bias check",
        "allure": "ALLURE: the evaluator per round",
    }[kind] in text and "{" not in text


def test_a_judge_run_without_models_says_so(runs, tmp_path, capsys):
    inp = write_jsonl(
        tmp_path / "plain.jsonl", [{k: v for k, v in it.items() if k not in ("model", "label")} for it in JUDGE_ITEMS]
    )
    out = tmp_path / "plain"
    assert (
        main(
            [
                "judge",
                inp,
                "--out",
                str(out),
                "--shots",
                "0",
                "--quiet",
                "--model",
                str(runs["model"]),
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["leaderboard", str(out)]) == 2
    assert "ranks no models: its input rows name none (a `model` field)" in capsys.readouterr().err
    assert main(["audit", str(out)]) == 0
    assert "no reference labels" in capsys.readouterr().out
    (out / "items.jsonl").unlink()  # a run directory of an earlier version
    assert main(["report", str(out)]) == 2
    assert "no items.jsonl" in capsys.readouterr().err and not (out / "report.html").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_json_documents_parse(kind, runs, capsys):
    run = str(runs["dirs"][kind])
    docs = {}
    for command in ("leaderboard", "audit"):
        code = main([command, run, "--json"])
        printed = capsys.readouterr()
        if kind == "allure" and command == "leaderboard":
            assert code == 2 and printed.out == ""
            continue
        assert code == 0
        docs[command] = json.loads(printed.out, parse_constant=lambda name: pytest.fail(name))
        assert docs[command]["kind"] == kind
    if kind == "judge":
        assert {m["model"] for m in docs["leaderboard"]["by_model"]} == {"good", "bad"}
        assert [e["k"] for e in docs["audit"]["by_k"]] == [0] and len(docs["audit"]["agreement"]) == 1
    if kind == "pairwise":
        assert docs["audit"]["checks"][0]["measure"] == "position_flip_rate"
        assert docs["audit"]["checks"][0]["ideal"] == 0.0 and len(docs["leaderboard"]["leaderboard"]) == 2


def _run_json(runs, kind, capsys) -> str:
    """The run command again with --json (nothing left to compute): its stdout."""
    argv = commands(runs["root"], runs["model"], runs["dirs"][kind])[kind]
    assert main([a for a in argv if a != "--quiet"] + ["--json"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS)
def test_run_commands_json_and_quiet(kind, runs, tmp_path, capsys):
    """--json: stdout is one JSON document; --quiet on a fresh run: nothing but warnings and errors."""
    doc = json.loads(_run_json(runs, kind, capsys))
    assert {"score": "leaderboards", "judge": "by_k", "pairwise": "audit", "allure": "rounds"}[kind] in doc
    argv = commands(runs["root"], runs["model"], tmp_path / "fresh")[kind]
    assert main(argv + (["--quiet"] if "--quiet" not in argv else [])) == 0
    printed = capsys.readouterr()
    assert printed.out == ""
    _clean_quiet_stderr(printed.err)


# ---- the judge's CIs and truth column --------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval, written out (the reference for scipy's)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_judge_summary_has_cis_and_truth():
    items = [
        {"id": f"{m}{n}", "model": m, "label": lab}
        for m, labels in (("a", [1, 1, 1, 0]), ("b", [0, 0, 1, 0]))
        for n, lab in enumerate(labels)
    ]
    grades = {"a": [8.0, 7.5, 9.0, 6.0], "b": [3.0, 4.0, 6.5, 2.5]}
    rows = [
        {"id": f"{m}{n}", "k": 0, "run": 0, "expected": g, "argmax": round(g), "probs": [0.1] * 10}
        for m, gs in grades.items()
        for n, g in enumerate(gs)
    ]
    s = judge_summary(items, rows)
    (a, b) = s["by_model"]
    assert (a["model"], a["rank"], a["true_rank"], b["rank"], b["true_rank"]) == ("a", 1, 1, 2, 2)
    assert a["truth"] == 0.75 and a["truth_ci"] == pytest.approx(wilson(3, 4), abs=1e-9)
    assert b["truth"] == 0.25 and b["truth_ci"] == pytest.approx(wilson(1, 4), abs=1e-9)
    assert a["ci"][0] < a["mean_expected"] < a["ci"][1] and min(grades["a"]) <= a["ci"][0]
    (k0,) = s["by_k"]
    assert k0["items"] == 8 and k0["ci"][0] < k0["mean_expected"] < k0["ci"][1]
    (agreement,) = s["agreement"]
    assert agreement["n"] == 8 and agreement["ci"][0] <= agreement["auc"] <= agreement["ci"][1]
    assert mean_ci([5.0]) is None and mean_ci([2.0, 2.0]) == [2.0, 2.0] and share_ci(0, 0) is None


# ---- pairwise: measured vs ideal, and a distrusted ranking marked ----------------------------------------------------
def _position_biased_rows() -> list[dict]:
    """A judge that picks the answer shown first (slightly less often for the better one): with --no-tie its
    aggregate crowns the worse model of every pair, which the reference says lost."""
    first = {"AB": "model_a", "BA": "model_b", "AB_sym": "model_a", "BA_sym": "model_b"}
    rows = []
    for n, (good, bad) in enumerate([("strong", "weak"), ("strong", "mid"), ("mid", "weak")] * 2):
        variants = {
            v: {"model_a": 0.9 if o == "model_a" else 0.05, "model_b": 0.95 if o == "model_b" else 0.1, "tie": 0.0}
            for v, o in first.items()
        }
        agg = {o: sum(p[o] for p in variants.values()) / 4 for o in ("model_a", "model_b", "tie")}
        rows.append(
            {
                "id": f"p{n}",
                "model_a": good,
                "model_b": bad,
                "winner": "model_a",
                "variants": variants,
                "verdicts": first,
                "aggregate": agg,
                "verdict": "model_b",
            }
        )
    return rows


def test_a_ranking_the_bias_check_distrusts_is_marked(tmp_path):
    s = pairwise_summary(_position_biased_rows(), bootstrap=20)
    assert s["leaderboard"][0]["model"] == "weak"  # the worst model first
    assert any("position in 100% of the swaps" in d for d in s["distrusted"])
    board = pairwise_leaderboard_table(s).text()
    assert "distrusted" in board.splitlines()[0]
    assert all(line.startswith("! ") for line in board.splitlines()[2:5]) and "DISTRUSTED RANKING" in board
    audit = pairwise_audit_table(s).text()
    assert "without bias" in audit.splitlines()[1] and "a judge without bias: flips 0" not in audit
    flip = next(line for line in audit.splitlines() if "position flip rate" in line)
    assert flip.startswith("! ") and flip.split()[4:6] == ["1.00", "0.00"]  # measured, then ideal
    first = next(line for line in audit.splitlines() if "first position share" in line)
    assert first.split()[3:5] == ["1.00", "0.50"]


def test_pairwise_report_marks_a_distrusted_ranking(runs, tmp_path, capsys):
    run = tmp_path / "biased"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command": "pairwise", "bootstrap": 20, "seed": 0, "tie": False}))
    write_jsonl(
        run / "items.jsonl",
        [
            {
                "id": r["id"],
                "question": "q",
                "answer_a": "a",
                "answer_b": "b",
                "model_a": r["model_a"],
                "model_b": r["model_b"],
                "winner": r["winner"],
            }
            for r in _position_biased_rows()
        ],
    )
    write_jsonl(run / "verdicts.jsonl", _position_biased_rows())
    assert main(["leaderboard", str(run)]) == 0
    printed = capsys.readouterr()
    assert "DISTRUSTED RANKING" in printed.out and "this judge is biased" in printed.err
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "Leaderboard <span class=warn>(DISTRUSTED)</span>" in page and page.count("<tr class=flag>") >= 3


def test_table_text_aligns_numbers_right_and_marks_rows():
    t = Table(
        "t", ("name", "value", "CI"), (("a", "1.00", "[0.10, 0.90]"), ("bb", "-", "-")), ("note",), frozenset({1})
    )
    assert t.text().splitlines() == [
        "t",
        "  name  value            CI",
        "  a      1.00  [0.10, 0.90]",
        "! bb        -             -",
        "  note",
    ]
    with pytest.raises(ValueError):
        Table("t", ("a",), (("1", "2"),))
