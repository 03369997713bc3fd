"""End to end on a tiny random model: `icqs score` with all four methods, resumption without rescoring, the
leaderboard and report commands, and one-line errors that leave nothing behind."""

import json
import re

import numpy as np
import pytest

from engine import Engine
from icqs.candidates import read_candidates
from icqs.cli import main
from icqs.io import ResultWriter
from icqs.sampler import demo_sets
from icqs.scoring import compute_loglik, mixture_requests
from icqs.task import load_task

TASK = """name: tiny
template: "Q: {x}\\nA: {y}"
good: [{x: one, y: "yes"}, {x: two, y: "no"}, {x: three, y: "yes"}]
bad: [{x: one, y: "no"}, {x: two, y: "yes"}, {x: three, y: "no"}]
labels: ["yes", "no"]
M: 2
N: 2
L: 2
"""


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "task.yaml").write_text(TASK)
    rows = [
        {"id": f"{m}{i}", "model": m, "x": x, "y": y, "truth": t}
        for m, answers in (("good", ["yes", "no"]), ("bad", ["no", "yes"]))
        for i, (x, y, t) in enumerate(zip(["four", "five"], answers, [1.0 if m == "good" else 0.0] * 2))
    ]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_loglik_table_equals_one_request_at_a_time(files, tiny_model_dir, tmp_path):
    eng = Engine.load(str(tiny_model_dir), dtype="float32")
    task, cands = load_task(files / "task.yaml"), read_candidates(files / "c.jsonl")
    with ResultWriter(tmp_path / "ll.jsonl", ("sampler", "l", "id")) as w:
        table = compute_loglik(eng, task, cands, w, "coupled", repeats=2, progress=False)
    sets = demo_sets(task, "coupled", 2)
    for l in range(2):
        reqs = mixture_requests(task, sets[l], cands)
        single = [eng.score([r])[0].logprob for r in reqs]
        assert np.allclose(table[:, l, :].T.reshape(-1), single, atol=1e-4)


def test_score_resume_leaderboard_report(files, tiny_model_dir, capsys, monkeypatch):
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
        "icl",
        "judge",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    for method in ("== icqs", "== epistemic", "== icl", "== judge", "Spearman"):
        assert method in text
    scores = [json.loads(x) for x in (out / "scores.jsonl").read_text().splitlines()]
    # 3 demo draws (the default) for the methods that use demos, one for the judge
    assert {s["method"] for s in scores} == {"icqs", "epistemic", "icl", "judge"} and len(scores) == 4 * (3 * 3 + 1)
    for s in scores:
        if s["method"] in ("icqs", "epistemic"):
            assert s["score"] in (0.0, 0.25, 0.5, 0.75, 1.0) and s["ci_low"] <= s["expected"] <= s["ci_high"]
            assert sum(s["posterior"]) == pytest.approx(1.0)
        if s["method"] == "judge":
            assert 0.0 <= s["score"] <= 1.0 and (s["generated"] is None or 1 <= s["generated"] <= 5)
    # a second run finds everything done: the engine scores nothing
    calls = []
    real = Engine.score
    monkeypatch.setattr(Engine, "score", lambda self, reqs, **kw: calls.append(len(reqs)) or real(self, reqs, **kw))
    before = (out / "loglik.jsonl").read_text()
    assert main(args) == 0
    assert calls == [] and (out / "loglik.jsonl").read_text() == before
    capsys.readouterr()
    assert main(["leaderboard", str(out)]) == 0 and "== epistemic" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    # curves x2, scores x4, ranking x4 (no audit plot: this pool of 3 + 3 is too small to cross-validate)
    assert html.count('<img src="data:image/png;base64,') == 2 + 4 + 4 and "skipped: the pool is too small" in html
    assert html.index("Evaluator audit") < html.index("<h2>ICQS (argmax") and "How to read this" in html
    assert html.split("<h2>Per item</h2>")[1].count("<tr><td>") == 4  # one row per candidate
    assert "nan" not in re.sub(r'base64,[^"]+', "", html).lower()  # nan is shown one way: '-'
    assert "ICQS-Epistemic" in html


def test_bad_inputs_are_one_line_errors_and_write_nothing(files, tiny_model_dir, capsys):
    (files / "c.jsonl").write_text('{"id": 1, "model": "m", "x": "q", "y": "yes"}\n{"id": 2, "model": "m"}\n')
    out = files / "run"
    assert main(["score", str(files / "task.yaml"), str(files / "c.jsonl"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {files / 'c.jsonl'}:2: missing fields 'x', 'y'\n" and not out.exists()
    (files / "task.yaml").write_text(TASK.replace("N: 2", "N: two"))
    assert main(["score", str(files / "task.yaml"), str(files / "c.jsonl"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {files / 'task.yaml'}:7: 'N': 'two' is not of type 'integer'")
    assert main(["leaderboard", str(files)]) == 2
    assert "not a run directory" in capsys.readouterr().err
