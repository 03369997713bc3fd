"""The paper's baselines with hand-checked numbers (a table-driven engine), and the demo's simulated models."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from icqs.baselines import RATING_OPTIONS, compute_icl, compute_judge, icl_score, judge_prompt, judge_score
from icqs.candidates import Candidate
from icqs.demo import MODELS, demo_candidates, demo_task, task_yaml
from icqs.io import ResultWriter
from icqs.task import Example, Task, load_task


class OptionEngine:
    """log P(continuation | context) from a table keyed by (text in the context, continuation); generation returns
    fixed texts in order."""

    def __init__(self, table, texts=()):
        self.table, self.texts = table, list(texts)

    def score(self, requests, share_prefix=True, progress=False):
        out = []
        for ctx, cont in requests:
            lp = next(v for (needle, c), v in self.table.items() if needle in ctx and c == cont)
            out.append(SimpleNamespace(logprob=lp))
        return out

    def generate(self, prompts, **kw):
        return [SimpleNamespace(text=self.texts.pop(0)) for _ in prompts]


def _task():
    return Task(
        "t",
        "Q: {x}\nA: {y}",
        [Example("g", "yes")],
        [Example("b", "no")],
        labels=["yes", "no"],
        M=1,
        N=2,
        L=1,
        judge_question="Is it so: {x}",
    )


def test_icl_predicts_the_most_likely_label_and_scores_agreement(tmp_path):
    task = _task()
    eng = OptionEngine(
        {
            ("Q: sky\n", "yes"): math.log(0.3),
            ("Q: sky\n", "no"): math.log(0.1),
            ("Q: sea\n", "yes"): math.log(0.2),
            ("Q: sea\n", "no"): math.log(0.6),
        }
    )
    cands = [
        Candidate("1", "m", "sky", "yes"),
        Candidate("2", "m", "sky", "no"),
        Candidate("3", "m", "sea", "yes"),
        Candidate("4", "m", "sea", "maybe"),
    ]
    with ResultWriter(tmp_path / "icl.jsonl", "id") as w:
        compute_icl(eng, task, cands, w, progress=False)
        rows = {r["id"]: r for r in w.rows}
    # the all-good demo set precedes each question
    assert [icl_score(task, c, rows[c.id]) for c in cands] == [
        {"score": 1.0, "predicted": "yes", "p_label": pytest.approx(0.75)},
        {"score": 0.0, "predicted": "yes", "p_label": pytest.approx(0.25)},
        {"score": 0.0, "predicted": "no", "p_label": pytest.approx(0.25)},
        {"score": 0.0, "predicted": "no", "p_label": 0.0},
    ]


def test_judge_expected_rating_and_unparsable_generation_is_unscored(tmp_path):
    task = _task()
    probs = [0.1, 0.0, 0.2, 0.3, 0.4]  # ratings 1..5: expected 0.1 + 0.6 + 1.2 + 2.0 = 3.9
    table = {("Rating:", o): (math.log(p) if p else -1e9) for o, p in zip(RATING_OPTIONS, probs)}
    eng = OptionEngine(table, texts=[" 4", " excellent answer", " [[5]]"])
    # candidates 0 and 3 have the same prompt: one generation serves both
    cands = [Candidate(str(i), "m", "x", y) for i, y in enumerate(["y", "z", "w", "y"])]
    with ResultWriter(tmp_path / "judge.jsonl", "id") as w:
        compute_judge(eng, task, cands, w, progress=False)
        scores = [judge_score(r) for r in w.rows]
    assert scores[0]["expected_rating"] == pytest.approx(3.9) and scores[0]["score"] == pytest.approx(2.9 / 4)
    assert [s["generated"] for s in scores] == [4, None, 5, 4]
    assert [s["generated_score"] for s in scores] == [0.75, None, 1.0, 0.75]
    p = judge_prompt(task, cands[0])
    assert p.endswith(
        "[Question]\nIs it so: x\n[The Start of Assistant's Answer]\ny\n[The End of Assistant's Answer]\nRating:"
    )


def test_demo_task_yaml_loads_back(tmp_path):
    task = demo_task()
    (tmp_path / "demo_task.yaml").write_text(task_yaml(task))
    assert load_task(tmp_path / "demo_task.yaml") == task


def test_demo_models_have_exactly_their_accuracy():
    task = demo_task()
    cands = demo_candidates(task)
    for model, acc in MODELS.items():
        truth = [c.truth for c in cands if c.model == model]
        assert np.mean(truth) == pytest.approx(acc)
    pools = {e.x for e in task.good} | {e.x for e in task.bad}
    assert not pools & {c.x for c in cands}  # the held-out reviews are not demos
    assert all(c.y in task.labels for c in cands)
