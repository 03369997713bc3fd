"""Bias-controlled pairwise comparison: four prompts per pair (position swap x symbol swap, the paper's Table 2).

For a pair (X, Y) = (answer_a, answer_b) of answers to one question:
    Compare(A, B)   : X first as "A",  Y second as "B"
    Compare(B, A)   : Y first as "A",  X second as "B"    (position swap)
    Compare(A+, B+) : X first as "B",  Y second as "A"    (symbol swap: the symbols A and B change places)
    Compare(B+, A+) : Y first as "B",  X second as "A"    (both swaps)
The tie symbol stays "C". Each verdict over the symbols [[A]], [[B]], [[C]] is mapped back to the answers, giving
(P(model_a better), P(model_b better), P(tie)); the aggregated verdict averages the four. Since every pair is shown in both
positions and under both symbol assignments, a judge without bias picks the first position and the symbol "A"
half of the time; the rates below measure how far it is from that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..options import option_logprobs
from .prompts import VERDICT_PREFIX, chat_wrap, pairwise_prompt

SYMBOLS = ("A", "B", "C")  # C: tie
OUTCOMES = ("model_a", "model_b", "tie")  # answer-level verdicts: X = answer_a, Y = answer_b


@dataclass(frozen=True)
class Variant:
    name: str
    x_first: bool  # X is shown in the first position
    first_label: str  # the symbol of the first position ("A" or "B")

    @property
    def labels(self) -> tuple[str, str]:
        return (self.first_label, "B" if self.first_label == "A" else "A")

    def symbol_of(self, outcome: str) -> str:
        """The verdict symbol meaning `outcome` ("model_a", "model_b", "tie") in this variant."""
        if outcome == "tie":
            return "C"
        first = (outcome == "model_a") == self.x_first
        return self.labels[0] if first else self.labels[1]

    def outcome_of(self, symbol: str) -> str:
        return next(o for o in OUTCOMES if self.symbol_of(o) == symbol)

    def position_of(self, outcome: str) -> str | None:
        """ "first" / "second" for a decisive outcome, None for a tie."""
        if outcome == "tie":
            return None
        return "first" if (outcome == "model_a") == self.x_first else "second"

    def prompt(self, question: str, x: str, y: str, tie: bool = True, rubric: str | None = None) -> str:
        first, second = (x, y) if self.x_first else (y, x)
        return pairwise_prompt(question, first, second, self.labels, tie, rubric)

    def layout(self) -> str:
        """What this variant shows where, for readers of the verdicts file."""
        a_label = self.symbol_of("model_a")
        b_label = self.symbol_of("model_b")
        first = "answer_a" if self.x_first else "answer_b"
        return f"{first} shown first; answer_a labeled {a_label}, answer_b labeled {b_label}, tie C"


VARIANTS = (
    Variant("AB", x_first=True, first_label="A"),
    Variant("BA", x_first=False, first_label="A"),
    Variant("AB_sym", x_first=True, first_label="B"),
    Variant("BA_sym", x_first=False, first_label="B"),
)
# Variant pairs that change one factor only. Position: each answer keeps its symbol, the positions are exchanged.
# Symbol: each answer keeps its position, the symbols are exchanged. (The usual MT-Bench swap, AB vs BA, exchanges
# the answers while the symbols stay with the positions, so it changes both: ORDER_SWAPS.)
POSITION_SWAPS = (("AB", "BA_sym"), ("BA", "AB_sym"))
SYMBOL_SWAPS = (("AB", "AB_sym"), ("BA", "BA_sym"))
ORDER_SWAPS = (("AB", "BA"), ("AB_sym", "BA_sym"))


def verdict_options(tie: bool = True) -> list[str]:
    return [f"[[{s}]]" for s in (SYMBOLS if tie else SYMBOLS[:2])]


def to_outcome_probs(variant: Variant, symbol_probs) -> np.ndarray:
    """[P(A), P(B), P(C)] (or [P(A), P(B)] without ties) of one variant -> [P(model_a better), P(model_b
    better), P(tie)]."""
    p = dict(zip(SYMBOLS, np.asarray(symbol_probs, dtype=np.float64)))
    return np.array([p.get(variant.symbol_of(o), 0.0) for o in OUTCOMES])


def labeled(probs) -> dict:
    """An answer-level distribution as {model_a, model_b, tie} (what the verdicts file stores)."""
    return {o: round(float(p), 6) for o, p in zip(OUTCOMES, probs)}


def as_array(probs) -> np.ndarray:
    """A stored distribution (labeled dict, or the older [model_a, model_b, tie] list) as an array."""
    return np.array([probs[o] for o in OUTCOMES] if isinstance(probs, dict) else probs, dtype=np.float64)


def parse_verdict(text: str) -> str | None:
    """The symbol of the final verdict in generated text (the last [[A]] / [[B]] / [[C]]), or None."""
    found = re.findall(r"\[\[\s*([ABC])\s*\]\]", text or "")
    return found[-1] if found else None


def aggregate(outcome_probs: list[np.ndarray]) -> np.ndarray:
    """The aggregated verdict distribution: the mean of the variants' answer-level distributions."""
    return np.mean(np.stack(outcome_probs), axis=0)


def decide(probs, decisive: bool = False) -> str:
    """The outcome with the largest probability; decisive: model_a or model_b only (the tie option ignored)."""
    probs = as_array(probs)
    return OUTCOMES[int(np.argmax(probs[:2] if decisive else probs))]


def pairwise_logprob_verdicts(
    engine, items: list[dict], progress: bool = False, tie: bool = True, rubric: str | None = None
) -> list[dict]:
    """items: dicts with question, x, y. For each item and variant the verdict distribution read from the
    log-probs of "[[A]]", "[[B]]", "[[C]]" (without `tie`: "[[A]]", "[[B]]"; one scoring call for all of them),
    mapped to the answers as {model_a, model_b, tie}; the aggregate of the four; each variant's verdict and the
    aggregated verdict (argmax)."""
    options = verdict_options(tie)
    prompts = [
        chat_wrap(engine.tokenizer, v.prompt(it["question"], it["x"], it["y"], tie, rubric), VERDICT_PREFIX)
        for it in items
        for v in VARIANTS
    ]
    lp = option_logprobs(engine, prompts, options, normalize=True, progress=progress)
    probs = np.exp(lp).reshape(len(items), len(VARIANTS), len(options))
    out = []
    for i in range(len(items)):
        per = {v.name: to_outcome_probs(v, probs[i, j]) for j, v in enumerate(VARIANTS)}
        agg = aggregate(list(per.values()))
        out.append(
            {
                "variants": {k: labeled(p) for k, p in per.items()},
                "verdicts": {k: decide(p) for k, p in per.items()},
                "aggregate": labeled(agg),
                "verdict": decide(agg),
            }
        )
    return out


def pairwise_generated_verdicts(
    engine,
    items: list[dict],
    max_tokens: int = 256,
    progress: bool = False,
    tie: bool = True,
    rubric: str | None = None,
) -> list[dict]:
    """The judge's own generated judgment for each variant, its verdict parsed and mapped back (None: no verdict
    in the text), and the majority of the four ("tie" when model_a and model_b get as many votes)."""
    prompts = [
        chat_wrap(engine.tokenizer, v.prompt(it["question"], it["x"], it["y"], tie, rubric))
        for it in items
        for v in VARIANTS
    ]
    gens = engine.generate(prompts, max_tokens=max_tokens, temperature=0.0, progress=progress)
    out = []
    for i in range(len(items)):
        verdicts = {}
        for j, v in enumerate(VARIANTS):
            symbol = parse_verdict(gens[i * len(VARIANTS) + j].text)
            verdicts[v.name] = None if symbol is None else v.outcome_of(symbol)
        out.append(
            {
                "verdicts": verdicts,
                "verdict": majority(list(verdicts.values())),
                "texts": {v.name: gens[i * len(VARIANTS) + j].text for j, v in enumerate(VARIANTS)},
            }
        )
    return out


def majority(verdicts: list[str | None]) -> str | None:
    """The aggregated generated verdict: the answer with more votes, "tie" when equal, None without votes."""
    votes = [o for o in verdicts if o is not None]
    a, b = votes.count("model_a"), votes.count("model_b")
    return None if not votes else "model_a" if a > b else "model_b" if b > a else "tie"


def _accuracy(rows: list[dict], verdict_of) -> dict:
    """Agreement of verdict_of(row) with row["winner"]; None verdicts count as wrong and are reported."""
    labelled = [r for r in rows if r.get("winner") is not None]
    got = [verdict_of(r) for r in labelled]
    return {
        "n": len(labelled),
        "accuracy": float(np.mean([g == r["winner"] for g, r in zip(got, labelled)])) if labelled else None,
        "no_verdict": sum(g is None for g in got),
    }


def summarize_pairwise(rows: list[dict]) -> dict:
    """Accuracy against the `winner` labels (per variant and aggregated; `decisive`: tie option ignored), bias
    and flip rates of the log-prob verdicts, and the same for the generated ones when present."""
    summary = {
        "pairs": len(rows),
        "variants": {v.name: v.layout() for v in VARIANTS},
        "logprob": {"bias": bias_report([r["verdicts"] for r in rows])},
    }
    if any(r.get("winner") is not None for r in rows):
        acc = {v.name: _accuracy(rows, lambda r, n=v.name: r["verdicts"][n]) for v in VARIANTS}
        acc["aggregate"] = _accuracy(rows, lambda r: r["verdict"])
        for v in VARIANTS:
            acc[f"{v.name}_decisive"] = _accuracy(rows, lambda r, n=v.name: decide(r["variants"][n], True))
        acc["aggregate_decisive"] = _accuracy(rows, lambda r: decide(r["aggregate"], True))
        summary["logprob"]["accuracy"] = acc
    gen_rows = [r["generated"] for r in rows if "generated" in r]
    if gen_rows:
        complete = [g["verdicts"] for g in gen_rows if None not in g["verdicts"].values()]
        gen = {
            "pairs": len(gen_rows),
            "without_a_verdict": sum(o is None for g in gen_rows for o in g["verdicts"].values()),
            "bias_on_fully_parsed": bias_report(complete),
        }
        if any(r.get("winner") is not None for r in rows):
            both = [{**g, "winner": r.get("winner")} for r, g in zip(rows, gen_rows)]
            gen["accuracy"] = {v.name: _accuracy(both, lambda g, n=v.name: g["verdicts"][n]) for v in VARIANTS}
            gen["accuracy"]["aggregate"] = _accuracy(both, lambda g: g["verdict"])
        summary["generated"] = gen
    return summary


def bias_report(verdicts: list[dict[str, str]]) -> dict:
    """Bias and flip rates from answer-level verdicts, one dict per pair: variant name -> an OUTCOMES value.

    position_bias_rate: share of POSITION_SWAPS prompt pairs in which the judge picked the same position both
    times (so a different answer); symbol_bias_rate: the same for SYMBOL_SWAPS pairs and the same symbol;
    position_flip_rate / symbol_flip_rate / order_flip_rate: share of POSITION_SWAPS / SYMBOL_SWAPS /
    ORDER_SWAPS prompt pairs whose answer-level verdicts differ at all (ties included); flip_rate: share of pairs
    whose four verdicts are not all the same; first_position_share and symbol_A_share: among decisive verdicts,
    the share that chose the first position / the symbol A (0.5 = no preference)."""
    by_name = {v.name: v for v in VARIANTS}
    n = len(verdicts)
    if n == 0:
        return {"pairs": 0}
    pos_same = pos_flip = sym_same = sym_flip = order_flip = 0
    first = a_sym = decisive = 0
    for ver in verdicts:
        for a, b in POSITION_SWAPS:
            pos_flip += ver[a] != ver[b]
            pa, pb = by_name[a].position_of(ver[a]), by_name[b].position_of(ver[b])
            pos_same += pa is not None and pa == pb
        for a, b in SYMBOL_SWAPS:
            sym_flip += ver[a] != ver[b]
            sa, sb = by_name[a].symbol_of(ver[a]), by_name[b].symbol_of(ver[b])
            sym_same += sa != "C" and sa == sb
        order_flip += sum(ver[a] != ver[b] for a, b in ORDER_SWAPS)
        for name, outcome in ver.items():
            if outcome != "tie":
                decisive += 1
                first += by_name[name].position_of(outcome) == "first"
                a_sym += by_name[name].symbol_of(outcome) == "A"
    return {
        "pairs": n,
        "position_bias_rate": pos_same / (2 * n),
        "symbol_bias_rate": sym_same / (2 * n),
        "position_flip_rate": pos_flip / (2 * n),
        "symbol_flip_rate": sym_flip / (2 * n),
        "order_flip_rate": order_flip / (2 * n),
        "flip_rate": sum(len(set(v.values())) > 1 for v in verdicts) / n,
        "first_position_share": first / decisive if decisive else None,
        "symbol_A_share": a_sym / decisive if decisive else None,
        "tie_share": 1 - decisive / (len(VARIANTS) * n),
    }
