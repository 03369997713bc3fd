"""The judges on a tiny random model through the engine: nested K-shot grading with prefix sharing, the
rating-token distribution, four-way pairwise verdicts mapped back to the answers, demo caching."""

import json

import numpy as np
import pytest

from icqs.judges.grading import build_prompts, grade, rating_options
from icqs.judges.pairwise import (
    VARIANTS,
    as_array,
    pairwise_generated_verdicts,
    pairwise_logprob_verdicts,
    verdict_options,
)
from icqs.judges.prompts import RATING_PREFIX, VERDICT_PREFIX, Demo, chat_wrap, grading_problem, solution_text
from icqs.judges.reinforced import demo_drawer, generate_demos

ITEMS = [{"id": f"i{n}", "question": f"What is {n} + {n}?", "response": f"It is {2 * n}."} for n in range(6)]


@pytest.fixture(scope="module")
def engine(long_tiny_dir):
    from engine import Engine

    return Engine.load(str(long_tiny_dir), dtype="float32")


def _demos():
    return {it["id"]: Demo(it["question"], it["response"], solution_text(int(it["id"][1:]) + 3, "ok")) for it in ITEMS}


def test_rating_distribution_is_the_renormalised_option_scores(engine):
    jobs = build_prompts(ITEMS[:2], demo_drawer(_demos(), 0, per_item=False), [0, 1], "reinforced")
    rows = grade(engine, jobs)
    assert [(r["id"], r["k"]) for r in rows] == [("i0", 0), ("i0", 1), ("i1", 0), ("i1", 1)]
    for (_, _, prompt), row in list(zip(jobs, rows))[:2]:
        context = chat_wrap(engine.tokenizer, prompt, RATING_PREFIX)
        raw = np.array([r.logprob for r in engine.score([(context, o) for o in rating_options()])])
        expect = np.exp(raw - raw.max()) / np.exp(raw - raw.max()).sum()
        assert row["probs"] == pytest.approx(expect, abs=1e-5)
        assert row["expected"] == pytest.approx(float(expect @ np.arange(1, 11)), abs=1e-3)
        assert row["argmax"] == int(np.argmax(expect)) + 1


def test_nested_k_shot_prompts_share_their_demo_prefix(engine):
    drawer = demo_drawer(_demos(), 0, per_item=False)
    jobs = build_prompts(ITEMS[:2], drawer, [1, 2], "reinforced")
    grade(engine, jobs)
    shared = engine.last_stats
    lengths = [len(engine.tokenizer.encode(chat_wrap(engine.tokenizer, p, RATING_PREFIX))) for _, _, p in jobs]
    assert shared.requests == len(jobs) * 10
    # the 2-shot demo block is computed once for all items and all K, each rating option on top of its prompt
    assert shared.tokens_computed < 0.6 * sum(lengths)
    per_item = demo_drawer(_demos(), 0, per_item=True)
    grade(engine, build_prompts(ITEMS[:2], per_item, [1, 2], "reinforced"))
    assert engine.last_stats.tokens_computed > shared.tokens_computed


def test_pairwise_verdicts_are_mapped_back_to_the_answers(engine):
    item = {"question": "Which is better?", "x": "A short clear answer.", "y": "A long vague answer, maybe."}
    res = pairwise_logprob_verdicts(engine, [item])[0]
    for v in VARIANTS:
        context = chat_wrap(engine.tokenizer, v.prompt(item["question"], item["x"], item["y"]), VERDICT_PREFIX)
        raw = np.array([r.logprob for r in engine.score([(context, o) for o in verdict_options()])])
        p = dict(zip("ABC", np.exp(raw) / np.exp(raw).sum()))
        assert as_array(res["variants"][v.name]) == pytest.approx(
            [p[v.symbol_of("model_a")], p[v.symbol_of("model_b")], p["C"]], abs=1e-5
        )
    assert as_array(res["aggregate"]) == pytest.approx(
        np.mean([as_array(p) for p in res["variants"].values()], axis=0), abs=1e-5
    )
    assert res["verdict"] in ("model_a", "model_b", "tie")


def test_demos_are_the_judges_own_zero_shot_judgments_and_are_cached(engine, tmp_path):
    cache = tmp_path / "demos.jsonl"
    first = generate_demos(engine, ITEMS[:3], cache, max_tokens=6)
    lines = cache.read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["i0", "i1", "i2"] and set(first) == {"i0", "i1", "i2"}
    for it in ITEMS[:3]:
        row = json.loads(lines[int(it["id"][1:])])
        rows = grade(engine, [(it, 0, grading_problem(it["question"], it["response"]))])
        assert row["rating"] == rows[0]["argmax"]  # the rating is read from the rating tokens
        solution = json.loads(first[it["id"]].solution)  # valid JSON, the reason generated after the rating
        assert solution == {"rating": str(row["rating"]), "reason": row["reason"]} and '"' not in row["reason"]
    again = generate_demos(engine, ITEMS[:4], cache, max_tokens=6)  # only i3 is new
    assert cache.read_text().splitlines()[:3] == lines and len(cache.read_text().splitlines()) == 4
    assert {k: d.solution for k, d in again.items() if k != "i3"} == {k: d.solution for k, d in first.items()}


def test_generated_pairwise_verdicts_have_one_entry_per_variant(engine):
    item = {"question": "Which is better?", "x": "Yes.", "y": "No."}
    gen = pairwise_generated_verdicts(engine, [item], max_tokens=3)[0]
    assert set(gen["verdicts"]) == set(gen["texts"]) == {v.name for v in VARIANTS}
    assert all(o in (None, "model_a", "model_b", "tie") for o in gen["verdicts"].values())
