"""Issue 39: the likelihood baselines (zero-shot loglik / loglik_norm, few-shot at r = 1), the candidate-level AUC
against the truth beside the pool audit, verdicts the label cannot fool, and the headline with its next steps.
Hand-checked numbers against a table-driven engine; no model is loaded."""

import dataclasses
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest

from engine.stats import EngineStats
from icqs.audit import add_truth, auc, audit_entries, two_level_ci, warnings
from icqs.baselines import answer_bytes, compute_zeroshot, zeroshot_request
from icqs.candidates import Candidate, read_candidates
from icqs.headline import headline, primary
from icqs.io import ResultWriter
from icqs.methods import DEFAULT_METHODS, METHODS
from icqs.score_run import leaderboards, score_run
from icqs.task import Example, Task, load_task

DATA = Path(__file__).resolve().parent / "data"


class Result:
    def __init__(self, logprob, num_tokens):
        self.logprob, self.num_tokens = logprob, num_tokens


class KnowingEngine:
    """A simulated evaluator that knows the right answer to every question of the QA fixture: log P(y | context)
    = -0.5 per token of y, + 2 when y is the right answer to the context's last question, + 0.3 per right demo in
    the context when y is right (- 0.3 when wrong), + a small deterministic jitter per (context, y). Tokens: words."""

    def __init__(self, right: dict, demo_effect: float = 0.3):
        self.right, self.demo_effect = right, demo_effect
        self.calls, self.requests = 0, []
        self.last_stats = EngineStats()

    def score(self, requests, share_prefix=True, progress=False):
        self.calls += 1
        self.requests += list(requests)
        out = []
        for ctx, cont in requests:
            question = ctx.rsplit("Question: ", 1)[-1].split("\nAnswer:", 1)[0]
            y = cont.strip()
            tokens = max(1, len(y.split()))
            good = sum(self.right.get(q) == a for q, a in _demos(ctx))
            right = self.right.get(question) == y
            jitter = (zlib.crc32((ctx + "|" + cont).encode()) % 1000) / 1000 * 0.2  # the same in every process
            lp = -0.5 * tokens + (2.0 if right else 0.0) + self.demo_effect * good * (1 if right else -1) + jitter
            out.append(Result(lp - 8.0, tokens))
        return out


def _demos(ctx: str):
    for block in ctx.split("\n\n")[:-1]:
        if block.startswith("Question: ") and "\nAnswer: " in block:
            q, a = block[len("Question: ") :].split("\nAnswer: ", 1)
            yield q, a


def _fixture():
    task = load_task(DATA / "qa_task.yaml")
    candidates = read_candidates(DATA / "qa_candidates.jsonl")
    right = {e.x: e.y for e in task.good}
    right.update({c.x: c.y for c in candidates if c.truth == 1})
    return task, candidates, right


def test_the_fixture_is_the_issue_task():
    """12 questions, 4 models right on 11/12, 8/12, 5/12, 2/12; pools of 12 right and 12 wrong answers to 24
    other questions; free text."""
    task, candidates, _ = _fixture()
    assert len(task.good) == len(task.bad) == 12 and not task.is_label_task
    assert len({e.x for e in task.good + task.bad} | {c.x for c in candidates}) == 36
    acc = {m: np.mean([c.truth for c in candidates if c.model == m]) for m in {c.model for c in candidates}}
    assert sorted(acc.values()) == pytest.approx([2 / 12, 5 / 12, 8 / 12, 11 / 12])


def test_zero_shot_is_one_request_per_distinct_answer_sharing_the_header(tmp_path):
    task, candidates, right = _fixture()
    engine = KnowingEngine(right)
    with ResultWriter(tmp_path / "z.jsonl", "id") as w:
        compute_zeroshot(engine, task, candidates, w, progress=False)
        rows = {r["id"]: r for r in w.rows}
    distinct = {(c.x, c.y) for c in candidates}
    assert engine.calls == 1 and len(engine.requests) == len(distinct) < len(candidates)
    assert all(
        ctx == task.header + task.separator + task.x_part(x)
        for (ctx, _), x in zip(engine.requests, [r[0].split("Question: ")[1].split("\n")[0] for r in engine.requests])
    )
    score = {m: METHODS[m].score(task, candidates, list(rows.values()), "coupled") for m in ("loglik", "loglik_norm")}
    for c, s, n in zip(candidates, score["loglik"], score["loglik_norm"]):
        lp, tokens = rows[c.id]["loglik"], rows[c.id]["tokens"]
        assert s["score"] == lp and n["score"] == pytest.approx(lp / tokens)
        assert n["per_byte"] == pytest.approx(lp / len(task.y_part(c.y).encode()))
    assert answer_bytes(task, "é") == 2


def test_zero_shot_prompt_is_the_few_shot_prompt_without_its_demos():
    """The header is joined to what follows by the separator, before the demos and, with none, before the question:
    a header without a trailing newline is not glued to the zero-shot question, and the length check plans the
    request the engine gets."""
    task, candidates, _ = _fixture()
    assert not task.header.endswith("\n")
    c = candidates[0]
    few = task.demo_text(task.good[:2]) + task.x_part(c.x)
    zero, continuation = zeroshot_request(task, c)
    assert zero == task.header + task.separator + task.x_part(c.x)
    assert few.startswith(task.header + task.separator) and few.endswith(task.separator + task.x_part(c.x))
    assert zero == few.replace("".join(task.render(e) + task.separator for e in task.good[:2]), "")
    for name in ("loglik", "loglik_norm"):
        (planned,) = METHODS[name].requests(task, [c], "coupled")
        assert (planned.shared, planned.context, planned.continuation) == (
            task.header + task.separator,
            zero,
            continuation,
        )
    bare = dataclasses.replace(task, header="")
    assert zeroshot_request(bare, c)[0] == task.x_part(c.x)


def test_default_run_scores_the_likelihood_methods_without_extra_demo_work(tmp_path, monkeypatch):
    """fewshot reads r = 1 of the ICQS log: it adds no engine request to icqs + epistemic; loglik and
    loglik_norm share one zero-shot request per distinct answer."""
    monkeypatch.setattr("icqs.score_run.check_lengths", lambda *args: None)  # the table engine has no tokenizer
    task, candidates, right = _fixture()
    task.M, task.N, task.L = 2, 4, 2
    with_few, without = KnowingEngine(right), KnowingEngine(right)
    rows = score_run(with_few, task, candidates, tmp_path / "a", DEFAULT_METHODS, progress=False, draws=2, audit=False)
    score_run(without, task, candidates, tmp_path / "b", ("icqs", "epistemic"), progress=False, draws=2, audit=False)
    distinct = len({(c.x, c.y) for c in candidates})
    assert len(with_few.requests) == len(without.requests) + distinct
    assert {r["method"] for r in rows} == set(DEFAULT_METHODS)
    few = [r for r in rows if r["method"] == "fewshot" and r["draw"] == 0]
    loglik = {
        (r["sampler"], r["l"], r["id"]): r
        for r in map(json.loads, (tmp_path / "a" / "loglik.jsonl").read_text().splitlines())
    }
    for r in few:
        at_one = np.mean([loglik[("coupled", l, r["id"])]["loglik"][-1] for l in range(task.L)])
        assert r["score"] == pytest.approx(at_one / r["tokens"])
    # the knowing evaluator: the likelihood baselines put the models in their true order
    boards = {b["method"]: b for b in leaderboards(rows)}
    for m in ("loglik_norm", "fewshot"):
        assert boards[m]["measures"]["score"]["spearman"] == pytest.approx(1.0)


def test_the_audit_auc_is_that_of_the_draws_mean_score_as_the_leaderboard_ranks():
    """Why: the audit averaged per-draw AUCs while the leaderboard ranks each candidate by its mean over the draws;
    a measure noisy per draw (ICQS's argmax) looked at chance in the audit yet ranked the candidates well."""
    task = Task(
        "t",
        "Q: {x}\nA: {y}",
        [Example(f"g{i}", "a") for i in range(8)],
        [Example(f"b{i}", "b") for i in range(8)],
        M=2,
        N=2,
        L=1,
    )
    # in every draw half the good items score above the bad ones and half below (per-draw AUC 0.5), a different
    # half each draw: their mean over the draws is above every bad item's
    scored = [
        (d, f"good{i}", 1.0, "a", {"score": 0.6 + (0.15 if (i + d) % 2 == 0 else -0.15)})
        for d in range(6)
        for i in range(8)
    ]
    scored += [(d, f"bad{i}", 0.0, "b", {"score": 0.5}) for d in range(6) for i in range(8)]
    (e,) = [x for x in audit_entries(task, {"fewshot": scored}, 6) if x["measure"] == "score"]
    assert e["auc_draws"] == [0.5] * 6 and e["auc"] == 1.0 and e["verdict"] == "reliable"


def test_group_bootstrap_resamples_questions_not_answers():
    """Answers that move together (here: four copies of each) are resampled together: the CI is that of the
    distinct answers, wider than one counting every copy as new evidence."""
    rng = np.random.default_rng(0)
    truth12 = np.array([1, 0] * 6)
    scores12 = 0.5 * truth12 + rng.normal(size=12)
    copies = np.repeat(np.arange(12), 4)
    lo_all, hi_all = two_level_ci(scores12[copies][None, :], truth12[copies])
    lo_g, hi_g = two_level_ci(scores12[copies][None, :], truth12[copies], groups=copies)
    lo_12, hi_12 = two_level_ci(scores12[None, :], truth12)
    assert hi_g - lo_g > 1.5 * (hi_all - lo_all)
    assert abs((hi_g - lo_g) - (hi_12 - lo_12)) < 0.15
    assert lo_g <= auc(scores12, truth12) <= hi_g


def _entry(method, measure, a, ci, verdict, **kw):
    return {
        "method": method,
        "measure": measure,
        "auc": a,
        "ci": list(ci),
        "n": 24,
        "draws": 3,
        "folds": 3,
        "auc_draws": [a] * 3,
        "label_auc": None,
        "verdict": verdict,
        **kw,
    }


def _rows(order):
    """Score rows of four models whose scores follow `order` (best first), for the leaderboards."""
    rows = []
    for method in ("loglik", "loglik_norm", "fewshot", "icqs"):
        for k, m in enumerate(order):
            rows += [
                {
                    "method": method,
                    "draw": 0,
                    "model": m,
                    "id": f"{m}{q}",
                    "truth": float(q < 4 - k),
                    "score": -k + 0.1 * q,
                    "per_byte": -k,
                    "expected": 0.5,
                }
                for q in range(4)
            ]
    return rows


def test_headline_takes_the_reliable_measure_with_the_highest_auc_ties_to_the_cheaper():
    boards = leaderboards(_rows(["A", "B", "C", "D"]))
    task = Task("t", "Q: {x}\nA: {y}", [Example("a", "x")], [Example("b", "y")])
    entries = [
        _entry("icqs", "score", 0.97, (0.9, 1.0), "reliable"),
        _entry("fewshot", "score", 0.971, (0.9, 1.0), "reliable"),
        _entry("loglik_norm", "per_byte", 0.99, (0.95, 1.0), "reliable", label_bias=True, label_auc=0.95),
        _entry("loglik", "score", 0.99, (0.60, 1.0), "weak"),
    ]
    assert (primary(entries, boards)["method"], primary(entries, boards)["measure"]) == ("fewshot", "score")
    h = headline(entries, boards, task, {})
    assert h["lines"][0] == "Best: A by fewshot per token (audit reliable: AUC 0.97 [0.90, 1.00] on 24 pool answers)"
    assert h["ranking"] == ["A", "B", "C", "D"] and h["verdict"] == "reliable" and h["next_steps"] == []
    assert h["lines"][1].startswith("  ranking: A ")


def test_nothing_reliable_gives_next_steps_fitted_to_what_was_seen():
    boards = leaderboards(_rows(["A", "B", "C", "D"]))
    task = Task("t", "Q: {x}\nA: {y}", [Example("a", "x")], [Example("b", "y")])
    entries = [
        _entry("icqs", "score", 0.53, (0.33, 0.72), "at chance", truth_auc=0.9, truth_ci=[0.8, 0.97], agrees=False),
        _entry("loglik", "score", 0.66, (0.52, 0.83), "weak"),
    ]
    meta = {
        "model_info": {"name": "SmolLM2", "params": 134.5e6},
        "engine_stats": {"icqs": {"seconds": 60.0}},
        "audit_stats": {"icqs": {"seconds": 40.0}},
        "methods": ["icqs", "loglik"],
    }
    h = headline(entries, boards, task, meta)
    assert h["method"] is None and h["ranking"] == [] and h["verdict"] == "weak"
    assert h["lines"][0].startswith("No reliable measure: none of the 2 audited measures")
    steps = " | ".join(h["next_steps"])
    assert "--model gemma-3-270m" in steps and "about 3 min" in steps  # 100 s x 268 / 134.5
    assert "more pool examples: the audit scored 24 pool answers" in steps
    assert "icqs score separates their right from wrong answers (AUC 0.90" in steps
    assert "a label task" in steps  # free text
    said = warnings(entries)
    assert any("disagree" in w and "icqs score" in w for w in said)
    assert any(w.startswith("warning: loglik score: weak: some evidence") for w in said)


def test_truth_auc_beside_the_audit_and_absent_without_truth():
    cands = [Candidate(f"c{i}", "m", f"q{i // 2}", "y", float(i % 2)) for i in range(8)]
    rows = [
        {"method": "loglik", "draw": 0, "id": c.id, "model": "m", "truth": c.truth, "score": c.truth + 0.1 * i}
        for i, c in enumerate(cands)
    ]
    entries = add_truth([_entry("loglik", "score", 0.5, (0.3, 0.7), "at chance")], rows, cands)
    assert entries[0]["truth_auc"] == 1.0 and entries[0]["agrees"] is False and entries[0]["truth_n"] == 8
    no_truth = [dict(r, truth=None) for r in rows]
    entries = add_truth([_entry("loglik", "score", 0.5, (0.3, 0.7), "at chance")], no_truth, cands)
    assert "truth_auc" not in entries[0] and "truth_ci" not in entries[0]


def test_a_constant_score_is_called_constant():
    task = Task(
        "t",
        "Q: {x}\nA: {y}",
        [Example(f"g{i}", "a") for i in range(3)],
        [Example(f"b{i}", "b") for i in range(3)],
        M=2,
        N=2,
        L=1,
    )
    scored = [(0, f"{k}{i}", float(k == "good"), "a", {"score": 0.0}) for k in ("good", "bad") for i in range(3)]
    (e,) = audit_entries(task, {"loglik": scored}, 1)
    assert e["verdict"] == "constant" and e["auc"] == 0.5
    assert warnings([e])[0].startswith("warning: loglik score: constant: it gave every one of 6 pool answers")
    assert not math.isnan(e["ci"][0])


def test_the_audit_says_when_a_folds_demo_sets_cannot_vary():
    """Why: with 12 pool examples a side and N = 8 the audit's 3 folds train on exactly 8: every demo set of a fold
    shows the same examples, unlike the run's (8 of 12); the audit says so in audit.json and its table."""
    from icqs.audit import fold_note, format_audit

    task, _, _ = _fixture()
    note = fold_note(task)
    assert note.startswith("each fold trains on 8 good and 8 bad examples and N = 8")
    task.N = 5  # 2 folds train on 6
    assert fold_note(task) is None
    text = format_audit([_entry("fewshot", "score", 0.8, (0.7, 0.9), "reliable", fold_note=note)])
    assert f"  note: {note}" in text


def test_likelihood_leaderboards_average_rank_shares_not_raw_log_likelihoods():
    """Why: on the QA fixture the per-token log-likelihood told right from wrong at candidate AUC 0.96-0.99, yet its
    per-model mean ranked 8/12 above 11/12: one answer's extreme log-likelihood outweighed the rest. Rank shares
    (the chance an answer outranks a random one) give the true order."""
    rows = [
        {"method": "fewshot", "draw": 0, "model": "A", "id": f"A{q}", "truth": 1.0, "score": -1.0 - 0.01 * q}
        for q in range(11)
    ]
    rows.append({"method": "fewshot", "draw": 0, "model": "A", "id": "A11", "truth": 0.0, "score": -40.0})
    rows += [
        {
            "method": "fewshot",
            "draw": 0,
            "model": "B",
            "id": f"B{q}",
            "truth": float(q < 8),
            "score": -1.5 - 0.01 * q if q < 8 else -3.0,
        }
        for q in range(12)
    ]
    raw = np.mean([r["score"] for r in rows if r["model"] == "A"]) < np.mean(
        [r["score"] for r in rows if r["model"] == "B"]
    )
    board = leaderboards(rows)[0]
    models = board["measures"]["score"]["models"]
    assert raw and [m["model"] for m in models] == ["A", "B"]
    a = models[0]
    assert a["mean"] == pytest.approx(np.mean([(23 - q) / 23 for q in range(11)] + [0.0]))


def _null_audit(seed: int) -> list[dict]:
    """The audit entries of 9 measures that know nothing (random scores, each answer's score moving a little between
    3 draws) on a pool of 12 good and 12 bad answers."""
    measures = {
        "loglik": ("score",),
        "loglik_norm": ("score", "per_byte"),
        "fewshot": ("score", "per_byte"),
        "icqs": ("score", "expected"),
        "epistemic": ("score", "expected"),
    }
    task = Task(
        "t", "Q: {x}\nA: {y}", [Example(f"g{i}", "y") for i in range(12)], [Example(f"b{i}", "n") for i in range(12)]
    )
    rng = np.random.default_rng(seed)
    per_method = {}
    for method, names in measures.items():
        base = {x: rng.normal(size=24) for x in names}
        per_method[method] = [
            (d, f"i{i}", int(i < 12), "y", {x: base[x][i] + 0.3 * rng.normal() for x in names})
            for d in range(3)
            for i in range(24)
        ]
    return audit_entries(task, per_method, 3)


def test_the_headline_counts_the_measures_it_picks_from():
    """The best of 9 measures at chance has its 95% CI above 0.5 far more often than 1 time in 40: a headline taken
    from them must widen the CI for the 9 (Bonferroni, ci_family), or it names a measure that knows nothing."""
    boards = leaderboards(_rows(["A", "B", "C", "D"]))
    named_95 = named_family = 0
    for seed in range(6):  # 2 of these 6 null audits have a measure 'reliable' at 95%
        entries = _null_audit(seed)
        assert all(
            e["family"] == 9 and e["ci_family"][0] <= e["ci"][0] and e["ci_family"][1] >= e["ci"][1] for e in entries
        )
        named_95 += any(e["verdict"] == "reliable" for e in entries)
        named_family += primary(entries, boards) is not None
    assert named_95 >= 2 and named_family == 0


def test_a_measure_reliable_alone_but_not_among_those_compared_is_not_the_headline():
    boards = leaderboards(_rows(["A", "B", "C", "D"]))
    task = Task("t", "Q: {x}\nA: {y}", [Example("a", "x")], [Example("b", "y")])
    lucky = _entry("epistemic", "score", 0.83, (0.53, 0.96), "reliable", family=11, ci_family=[0.40, 0.98])
    h = headline(
        [lucky, _entry("loglik", "score", 0.6, (0.4, 0.8), "at chance", family=11, ci_family=[0.3, 0.9])],
        boards,
        task,
        {},
    )
    assert h["method"] is None and h["verdict"] == "not reliable with 11 measures compared"
    assert "but not once the 11 measures compared are counted: its 99.5% CI [0.40, 0.98] includes 0.5" in h["lines"][0]
    sure = _entry("fewshot", "score", 0.80, (0.68, 0.92), "reliable", family=11, ci_family=[0.58, 0.97])
    h = headline([lucky, sure], boards, task, {})
    assert (h["method"], h["measure"]) == ("fewshot", "score")
    assert h["lines"][0].endswith("on 24 pool answers; [0.58, 0.97] at 99.5% with the 11 measures compared)")


def test_label_following_scores_on_a_label_balanced_pool_suggest_calibration_not_a_cleaner_pool():
    """Where every label has the same share of the good and of the bad pool, a score that follows the label does so
    because the model prefers a label, not because the pool's labels go with correctness: the step is --calibrate."""
    boards = leaderboards(_rows(["A", "B", "C", "D"]))
    biased = [_entry("fewshot", "score", 0.62, (0.37, 0.83), "at chance", label_auc=0.0, label_bias=True)]
    balanced = Task(
        "t",
        "Q: {x}\nA: {y}",
        [Example("a", "yes"), Example("b", "no")],
        [Example("c", "yes"), Example("d", "no")],
        labels=["no", "yes"],
    )
    steps = " | ".join(headline(biased, boards, balanced, {})["next_steps"])
    assert "--calibrate" in steps and "cleaner pool" not in steps
    follows = [
        _entry(
            "loglik",
            "score",
            0.80,
            (0.60, 0.95),
            "reliable",
            label_auc=0.0,
            label_bias=True,
            family=11,
            ci_family=[0.45, 0.99],
        )
    ]
    h = headline(follows, boards, balanced, {})
    assert h["method"] is None and h["verdict"] == "label-following"
    assert "(reliable, following the label)" in h["lines"][0] and "measures compared" not in h["lines"][0]
    skewed = dataclasses.replace(balanced, good=[Example("a", "yes"), Example("b", "yes")])
    steps = " | ".join(headline(biased, boards, skewed, {})["next_steps"])
    assert "cleaner pool examples" in steps and "--calibrate" not in steps
    calibrated = dataclasses.replace(balanced, calibrate=True)
    assert "--calibrate" not in " | ".join(headline(biased, boards, calibrated, {})["next_steps"])
