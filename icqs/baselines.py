"""The paper's baselines and the likelihood baselines, computed through the same engine.

- Zero-shot likelihood (lm-evaluation-harness's `acc` / `acc_norm` read as a score): log P(y | header + x part),
  no demos, one request per distinct (x, y) sharing the header prefix; `loglik` is the sum over the answer's
  tokens, `loglik_norm` the same per token (`score`) and per byte of the scored continuation (`per_byte`).
- Few-shot likelihood: the answer's log-likelihood after the all-good demo sets (ratio r = 1 of every repeat, the
  very sets ICQS scores: read from its log, no engine work of its own), averaged over the L repeats, per token
  (`score`) and per byte (`per_byte`).
- Plain ICL: the all-good demo set (ratio r = 1 of repeat 0, the very set ICQS uses) before each candidate's x;
  the predicted label is the label option with the highest log-likelihood, and the candidate's quality is 1 when
  its answer agrees with that label, else 0 (`p_label`: the probability ICL gives the candidate's own answer).
- Verbalized judge (Appendix C, MT-Bench style): the judge prompt asks for a rating on a 1..5 scale after
  "Rating:"; the rating distribution is read from the log-probs of the rating tokens, giving the expected rating,
  and a greedy generation is parsed for a rating too. An unparsable generation is unscored (None), never the
  minimum. Both are mapped to [0, 1] as (rating - 1) / 4.
"""

from __future__ import annotations

import numpy as np

from engine.progress import progress_bar

from .candidates import Candidate
from .io import ResultWriter
from .options import option_logprobs, parse_rating
from .sampler import demo_sets
from .task import Task

CHUNK = 64  # candidates per engine call: the unit of resumption

JUDGE_LOW, JUDGE_HIGH = 1, 5
JUDGE_TEMPLATE = (
    "[Instruction]\n"
    "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant to the "
    "user question displayed below. Please rate the correctness of the response on a scale of 1 to 5, where 1 means "
    "incorrect and 5 means correct. Do not explain your evaluation.\n"
    "[Question]\n{question}\n"
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]\n"
    "Rating:"
)
RATING_OPTIONS = [f" {k}" for k in range(JUDGE_LOW, JUDGE_HIGH + 1)]


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def zeroshot_request(task: Task, c: Candidate) -> tuple[str, str]:
    """(context, continuation) of the zero-shot likelihood: the header joined by the separator as before the demos
    (task.demo_text of no demos), the x part, then the y part."""
    return task.demo_text([]) + task.x_part(c.x), task.y_part(c.y)


def compute_zeroshot(
    engine, task: Task, candidates: list[Candidate], writer: ResultWriter, progress: bool = True
) -> None:
    """log P(y | header + x part) per candidate; rows {id, loglik, tokens} (key: id). Candidates with the same
    (x, y) share one request; every request shares the header prefix."""
    todo = [c for c in candidates if not writer.done(c.id)]
    for part in progress_bar(
        _chunks(todo, CHUNK * 4), desc="zero-shot likelihood", unit="batch", disable=not progress or not todo
    ):
        requests = [zeroshot_request(task, c) for c in part]
        unique = list(dict.fromkeys(requests))
        results = dict(zip(unique, engine.score(unique, share_prefix=True, progress=progress)))
        for c, req in zip(part, requests):
            writer.write({"id": c.id, "loglik": float(results[req].logprob), "tokens": results[req].num_tokens})


def answer_bytes(task: Task, y: str) -> int:
    """The bytes of the scored continuation (the y part), for per-byte normalisation (lm-eval's acc_norm)."""
    return max(1, len(task.y_part(y).encode("utf-8")))


def zeroshot_score(task: Task, c: Candidate, row: dict, normalized: bool) -> dict:
    if not normalized:
        return {"score": row["loglik"], "tokens": row["tokens"]}
    return {
        "score": row["loglik"] / max(1, row["tokens"]),
        "per_byte": row["loglik"] / answer_bytes(task, c.y),
        "tokens": row["tokens"],
    }


def fewshot_scores(task: Task, candidates: list[Candidate], table: np.ndarray, tokens: dict) -> list[dict] | None:
    """Per candidate: its log-likelihood at ratio r = 1 (the last column of the [C, L, M + 1] ICQS table) averaged
    over the L repeats, per token (`score`) and per byte (`per_byte`); None while some row or token count is
    missing."""
    if np.isnan(table).any() or not all(c.id in tokens for c in candidates):
        return None
    at_one = table[:, :, -1].mean(axis=1)
    return [
        {
            "score": float(v) / max(1, tokens[c.id]),
            "per_byte": float(v) / answer_bytes(task, c.y),
            "loglik": float(v),
            "tokens": tokens[c.id],
        }
        for c, v in zip(candidates, at_one)
    ]


def icl_prompt(task: Task, demos: str, c: Candidate) -> str:
    return demos + task.x_part(c.x)


def compute_icl(
    engine,
    task: Task,
    candidates: list[Candidate],
    writer: ResultWriter,
    sampler: str = "coupled",
    progress: bool = True,
) -> None:
    """Label-option log-probs under the all-good demo set; rows {id, label_logprobs, predicted} (key: id)."""
    all_good = demo_sets(task, sampler, repeats=1)[0][task.M]
    demos = task.demo_text(list(all_good.examples))
    options = [task.y_part(label) for label in task.labels]
    todo = [c for c in candidates if not writer.done(c.id)]
    for part in progress_bar(_chunks(todo, CHUNK), desc="ICL baseline", unit="batch", disable=not progress or not todo):
        lp = option_logprobs(
            engine, [icl_prompt(task, demos, c) for c in part], options, normalize=True, progress=progress
        )
        for c, row in zip(part, lp):
            writer.write({"id": c.id, "label_logprobs": row.tolist(), "predicted": task.labels[int(np.argmax(row))]})


def icl_score(task: Task, c: Candidate, row: dict) -> dict:
    lp = row["label_logprobs"]
    p_label = float(np.exp(lp[task.labels.index(c.y)])) if c.y in task.labels else 0.0
    return {"score": 1.0 if row["predicted"] == c.y else 0.0, "predicted": row["predicted"], "p_label": p_label}


def judge_prompt(task: Task, c: Candidate) -> str:
    question = task.judge_question.replace("{x}", c.x) if task.judge_question else task.x_part(c.x).strip()
    return JUDGE_TEMPLATE.replace("{question}", question).replace("{answer}", c.y)


def compute_judge(
    engine, task: Task, candidates: list[Candidate], writer: ResultWriter, max_tokens: int = 4, progress: bool = True
) -> None:
    """Rating-token log-probs and a greedy generation per candidate; rows {id, rating_logprobs, text} (key: id).
    Candidates with the same prompt (models giving the same answer) share one generation."""
    todo = [c for c in candidates if not writer.done(c.id)]
    for part in progress_bar(
        _chunks(todo, CHUNK), desc="verbalized judge", unit="batch", disable=not progress or not todo
    ):
        prompts = [judge_prompt(task, c) for c in part]
        unique = list(dict.fromkeys(prompts))
        lp = option_logprobs(engine, unique, RATING_OPTIONS, normalize=True, progress=progress)
        gens = engine.generate(unique, max_tokens=max_tokens, temperature=0.0, stop=["\n"], progress=progress)
        by_prompt = {p: (row, gen.text) for p, row, gen in zip(unique, lp, gens)}
        for c, prompt in zip(part, prompts):
            row, text = by_prompt[prompt]
            writer.write({"id": c.id, "rating_logprobs": row.tolist(), "text": text})


def judge_score(row: dict) -> dict:
    """`score`: the expected rating from the rating-token distribution, mapped to [0, 1]; `generated`: the rating
    parsed from the generation (None: unscored) and `generated_score` the same mapped to [0, 1]."""
    ratings = np.arange(JUDGE_LOW, JUDGE_HIGH + 1)
    expected = float(np.exp(np.asarray(row["rating_logprobs"])) @ ratings)
    generated = parse_rating("Rating:" + row["text"], JUDGE_LOW, JUDGE_HIGH)
    scale = JUDGE_HIGH - JUDGE_LOW
    return {
        "score": (expected - JUDGE_LOW) / scale,
        "expected_rating": expected,
        "generated": generated,
        "generated_score": None if generated is None else (generated - JUDGE_LOW) / scale,
    }
