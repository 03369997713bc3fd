"""Four-way pairwise comparison: variant mapping, aggregation, verdict parsing, bias and flip rates."""

import pytest

from icqs.judges.pairwise import (
    VARIANTS,
    aggregate,
    bias_report,
    decide,
    majority,
    parse_verdict,
    summarize_pairwise,
    to_outcome_probs,
)

BY = {v.name: v for v in VARIANTS}


def test_variants_show_each_answer_in_both_positions_under_both_symbols():
    seen = {(v.x_first, v.first_label) for v in VARIANTS}
    assert seen == {(True, "A"), (False, "A"), (True, "B"), (False, "B")}
    p = BY["AB_sym"].prompt("q", "ANSWER-X", "ANSWER-Y")
    # X first, but called assistant B (the paper's Compare(A+, B+))
    assert p.index("Start of Assistant B's Answer]\nANSWER-X") < p.index("Start of Assistant A's Answer]\nANSWER-Y")
    p = BY["BA"].prompt("q", "ANSWER-X", "ANSWER-Y")
    assert p.index("Start of Assistant A's Answer]\nANSWER-Y") < p.index("Start of Assistant B's Answer]\nANSWER-X")


@pytest.mark.parametrize("name,symbol_for_x", [("AB", "A"), ("BA", "B"), ("AB_sym", "B"), ("BA_sym", "A")])
def test_symbols_map_back_to_answers(name, symbol_for_x):
    v = BY[name]
    assert v.symbol_of("model_a") == symbol_for_x and v.symbol_of("tie") == "C"
    assert v.outcome_of(symbol_for_x) == "model_a" and v.outcome_of("C") == "tie"
    probs = {"A": 0.7, "B": 0.2, "C": 0.1}
    out = to_outcome_probs(v, [probs["A"], probs["B"], probs["C"]])
    assert out[0] == pytest.approx(probs[symbol_for_x]) and out[2] == pytest.approx(0.1)


def test_aggregate_cancels_a_pure_symbol_bias():
    """A judge that always says [[A]] prefers X under two variants and Y under the other two: the aggregate ties
    X and Y, while a judge that reads the answers keeps its preference."""
    always_a = [to_outcome_probs(v, [0.9, 0.05, 0.05]) for v in VARIANTS]
    agg = aggregate(always_a)
    assert agg[0] == pytest.approx(agg[1])
    prefers_x = [
        to_outcome_probs(v, [0.8, 0.1, 0.1] if v.symbol_of("model_a") == "A" else [0.1, 0.8, 0.1]) for v in VARIANTS
    ]
    assert decide(aggregate(prefers_x)) == "model_a"
    assert decide([0.3, 0.2, 0.5]) == "tie" and decide([0.3, 0.2, 0.5], decisive=True) == "model_a"


def test_parse_verdict():
    assert parse_verdict("Assistant A is vague. [[B]]") == "B"
    assert parse_verdict("I first thought [[A]] but final verdict: [[ C ]]") == "C"
    assert parse_verdict("no verdict") is None


def _verdicts_of(symbol_choice):
    """Answer-level verdicts of a judge that picks symbol_choice(variant)."""
    return {v.name: v.outcome_of(symbol_choice(v)) for v in VARIANTS}


def test_bias_report_of_biased_and_unbiased_judges():
    always_a = bias_report([_verdicts_of(lambda v: "A")] * 3)
    assert always_a["symbol_bias_rate"] == 1.0 and always_a["symbol_A_share"] == 1.0
    assert always_a["flip_rate"] == 1.0 and always_a["position_bias_rate"] == 0.0
    assert always_a["order_flip_rate"] == 1.0  # the MT-Bench swap alone mistakes it for a position bias
    assert always_a["first_position_share"] == 0.5

    always_first = bias_report([_verdicts_of(lambda v: v.labels[0])] * 2)
    assert always_first["position_bias_rate"] == 1.0 and always_first["first_position_share"] == 1.0
    assert always_first["symbol_bias_rate"] == 0.0 and always_first["symbol_A_share"] == 0.5

    fair = bias_report([_verdicts_of(lambda v: v.symbol_of("model_a")), _verdicts_of(lambda v: "C")])
    assert fair["flip_rate"] == 0.0 and fair["position_bias_rate"] == 0.0 and fair["symbol_bias_rate"] == 0.0
    assert fair["tie_share"] == 0.5 and fair["position_flip_rate"] == 0.0


def test_bias_report_counts_single_flips():
    ver = {"AB": "model_a", "BA": "tie", "AB_sym": "model_a", "BA_sym": "model_a"}
    r = bias_report([ver])
    assert r["flip_rate"] == 1.0
    assert r["position_flip_rate"] == 0.5 and r["symbol_flip_rate"] == 0.5 and r["order_flip_rate"] == 0.5
    assert r["position_bias_rate"] == 0.0 and r["symbol_bias_rate"] == 0.0


def test_majority_of_generated_verdicts():
    assert majority(["model_a", "model_a", "model_b", None]) == "model_a"
    assert majority(["model_a", "model_b", "tie", "tie"]) == "tie"
    assert majority([None] * 4) is None


def test_summarize_pairwise_accuracy():
    rows = []
    for winner, probs in [("model_a", [0.6, 0.3, 0.1]), ("model_b", [0.2, 0.3, 0.5]), ("model_a", [0.3, 0.6, 0.1])]:
        variants = {v.name: probs for v in VARIANTS}
        rows.append(
            {
                "winner": winner,
                "variants": variants,
                "verdicts": {n: decide(p) for n, p in variants.items()},
                "aggregate": probs,
                "verdict": decide(probs),
            }
        )
    s = summarize_pairwise(rows)
    acc = s["logprob"]["accuracy"]
    assert acc["aggregate"]["accuracy"] == pytest.approx(1 / 3)  # the second is read as a tie
    assert acc["aggregate_decisive"]["accuracy"] == pytest.approx(2 / 3)
    assert s["logprob"]["bias"]["flip_rate"] == 0.0 and "generated" not in s
