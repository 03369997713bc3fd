"""`icqs judge` and `icqs pairwise` on a tiny model: outputs, summaries, resume, and one-line input errors."""

import json

import pytest
from jsonl_files import write_jsonl

from icqs.cli import main

ITEMS = [{"id": f"q{n}", "question": f"What is {n} + {n}?", "response": f"It is {2 * n}."} for n in range(3)]


@pytest.fixture(scope="module")
def model(long_tiny_dir):
    return str(long_tiny_dir)


def _rows(path):
    return [json.loads(x) for x in open(path)]


def test_judge_runs_resumes_and_reports_consistency(model, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ITEMS)
    run = tmp_path / "run"
    run.mkdir()
    # the demos' zero-shot judgments, as a previous run would have cached them
    write_jsonl(
        run / "demos.jsonl", [{"id": it["id"], "rating": n + 5, "reason": "fine"} for n, it in enumerate(ITEMS)]
    )
    argv = [
        "judge",
        inp,
        "--out",
        str(run),
        "--model",
        model,
        "--dtype",
        "float32",
        "--shots",
        "0,1",
        "--runs",
        "2",
        "--generate",
        "--max-tokens",
        "3",
        "--batch",
        "2",
        "--quiet",
    ]
    assert main(argv) == 0
    out = run / "grades.jsonl"
    rows = _rows(out)
    assert sorted((r["id"], r["k"], r["run"]) for r in rows) == sorted(
        (it["id"], k, r) for it in ITEMS for k in (0, 1) for r in (0, 1)
    )
    assert all(abs(sum(r["probs"]) - 1) < 1e-4 and "parsed" in r for r in rows)
    summary = json.load(open(run / "summary.json"))
    by_k = {c["k"]: c for c in summary["consistency"]}
    assert by_k[0]["logprob_exact"] == 1.0 and by_k[0]["expected_gap"] < 1e-3  # zero-shot: no draw to differ
    assert by_k[1]["items"] == 3 and "unscored" in by_k[1]
    # a killed run: half the rows and a torn line; the rerun completes exactly the missing ones
    lines = open(out).read().splitlines(keepends=True)
    open(out, "w").write("".join(lines[:5]) + lines[5][:20])
    assert main(argv) == 0
    again = _rows(out)
    assert len(again) == len(rows)
    key = {(r["id"], r["k"], r["run"]): r["probs"] for r in rows}
    for r in again:
        assert r["probs"] == pytest.approx(key[(r["id"], r["k"], r["run"])], abs=1e-5)
    # the same directory with other settings is refused
    assert main(argv[:-1] + ["--method", "unsupervised", "--quiet"]) == 2


def test_judge_auto_shots_and_too_many_shots(model, tmp_path, capsys):
    inp = write_jsonl(tmp_path / "in.jsonl", ITEMS)
    for name in ("auto", "many"):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "demos.jsonl", [{"id": it["id"], "rating": 7, "reason": "ok"} for it in ITEMS])
    base = ["judge", inp, "--model", model, "--dtype", "float32", "--quiet"]
    assert main(base + ["--out", str(tmp_path / "auto"), "--shots", "auto"]) == 0
    assert json.load(open(tmp_path / "auto" / "summary.json"))["shots"] == [0, 1, 2]
    assert main(base + ["--out", str(tmp_path / "many"), "--shots", "0,4"]) == 2
    assert "4 demos needed" in capsys.readouterr().err
    assert not (tmp_path / "many" / "grades.jsonl").exists()


def test_judge_bad_input_is_one_line_with_file_and_line(model, tmp_path, capsys):
    inp = tmp_path / "bad.jsonl"
    inp.write_text(json.dumps(ITEMS[0]) + "\n{not json\n")
    out = tmp_path / "run"
    assert main(["judge", str(inp), "--out", str(out), "--model", model]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {inp}:2: ") and "\n" not in err and not out.exists()
    inp.write_text(json.dumps({"question": "q"}) + "\n")
    assert main(["pairwise", str(inp), "--out", str(out), "--model", model]) == 2
    assert "missing fields 'answer_a', 'answer_b'" in capsys.readouterr().err


def test_pairwise_with_labels_and_leaderboard(model, tmp_path):
    names = ["m1", "m2", "m3"]
    rows = [
        {
            "id": f"p{i}",
            "question": "Name a colour.",
            "answer_a": f"Blue {i}.",
            "answer_b": "I do not know.",
            "model_a": names[i % 3],
            "model_b": names[(i + 1) % 3],
            "winner": "model_a",
        }
        for i in range(6)
    ]
    inp = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "run"
    assert (
        main(
            [
                "pairwise",
                inp,
                "--out",
                str(out),
                "--model",
                model,
                "--dtype",
                "float32",
                "--bootstrap",
                "20",
                "--batch",
                "4",
                "--quiet",
            ]
        )
        == 0
    )
    results = _rows(out / "verdicts.jsonl")
    assert [r["id"] for r in results] == [r["id"] for r in rows]
    assert all(set(r["variants"]) == {"AB", "BA", "AB_sym", "BA_sym"} for r in results)
    summary = json.load(open(out / "summary.json"))
    assert summary["pairs"] == 6 and 0 <= summary["logprob"]["bias"]["flip_rate"] <= 1
    assert summary["logprob"]["accuracy"]["aggregate"]["n"] == 6
    lb = json.load(open(out / "leaderboard.json"))
    assert {r["model"] for r in lb} == set(names) and all(1 <= r["rank"] <= 3 for r in lb)
