"""Prompt assembly of the many-shot judges: nested K-shot prompts, Prompt B at K=0, the unsupervised layout."""

import pytest

from icqs.judges.prompts import (
    GRADING_INSTRUCTION,
    RATING_PREFIX,
    REINFORCED_PREAMBLE,
    UNSUPERVISED_PREAMBLE,
    Demo,
    grading_problem,
    reinforced_prompt,
    solution_text,
    unsupervised_prompt,
)

DEMOS = [Demo(f"question {i}?", f"response {i}.", solution_text(i % 10 + 1, f"reason {i}")) for i in range(8)]


def test_zero_shot_is_prompt_b():
    p = reinforced_prompt("Q?", "R.", DEMOS, 0)
    assert p == grading_problem("Q?", "R.")
    assert p.startswith(GRADING_INSTRUCTION) and p.endswith("Question\n\nQ?\n\nResponse\n\nR.")
    assert unsupervised_prompt("Q?", "R.", DEMOS, 0) == p


@pytest.mark.parametrize("build", [reinforced_prompt, unsupervised_prompt])
def test_k_shot_prompt_contains_every_smaller_prompts_demos(build):
    prompts = {k: build("final question?", "final response.", DEMOS, k) for k in (1, 2, 4, 8)}
    for small, big in [(1, 2), (2, 4), (4, 8), (1, 8)]:
        for d in DEMOS[:small]:
            block = f"Question\n\n{d.question}\n\nResponse\n\n{d.response}"
            assert block in prompts[small] and block in prompts[big]
    for k, p in prompts.items():
        for d in DEMOS[k:]:
            if build is reinforced_prompt or DEMOS.index(d) >= 4:
                assert d.question not in p
        assert p.endswith("Question\n\nfinal question?\n\nResponse\n\nfinal response.\n\nSolution")


def test_reinforced_prompts_are_nested_prefixes():
    """The demo block of a K-shot prompt is a prefix of every larger one: the engine computes it once."""
    final = "Problem\n\n" + grading_problem("final question?", "final response.") + "\n\nSolution"
    blocks = [
        reinforced_prompt("final question?", "final response.", DEMOS, k).removesuffix(final) for k in (1, 2, 4, 8)
    ]
    assert blocks[0].startswith(REINFORCED_PREAMBLE)
    for small, big in zip(blocks, blocks[1:]):
        assert big.startswith(small) and len(big) > len(small)
    assert blocks[-1].count("Solution\n\n" + RATING_PREFIX) == 8


def test_unsupervised_layout():
    p = unsupervised_prompt("final question?", "final response.", DEMOS, 6)
    assert p.startswith(UNSUPERVISED_PREAMBLE)
    unsolved, solved = p.split(REINFORCED_PREAMBLE)
    assert unsolved.count("Problem\n\n") == 6 and "Solution" not in unsolved
    assert solved.count("Solution\n\n" + RATING_PREFIX) == 4  # the 4 appended solved demos
    assert "question 5?" in unsolved and "question 5?" not in solved


def test_too_few_demos():
    with pytest.raises(ValueError):
        reinforced_prompt("Q", "R", DEMOS[:3], 4)
    with pytest.raises(ValueError):
        unsupervised_prompt("Q", "R", DEMOS[:3], 2)


def test_solution_text_is_json():
    import json

    s = solution_text(7, ' says "hi" ')
    assert s.startswith(RATING_PREFIX) and json.loads(s) == {"rating": "7", "reason": 'says "hi"'}
