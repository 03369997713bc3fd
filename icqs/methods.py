"""The methods of `icqs score`, in one registry: how each is computed (its engine calls and result log), checked
(the requests it will send, for the length check before any work), scored (from its log's rows to per-candidate
numbers), titled and plotted. Everything else (score_run, the leaderboard, the report) loops over METHODS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import baselines, scoring
from .candidates import Candidate
from .sampler import demo_sets


@dataclass(frozen=True)
class PlannedRequest:
    """One request a method will send the engine, for the length check before any work: the context as the part
    many requests share (a demo set, tokenized once) and the rest."""

    candidate: Candidate
    shared: str  # the context's prefix shared with other requests ("" if none)
    rest: str  # the rest of the context
    continuation: str
    generated: int = 0  # tokens the engine generates after it (a judge's reply)

    @property
    def context(self) -> str:
        return self.shared + self.rest


@dataclass(frozen=True)
class Method:
    name: str
    title: str
    measures: tuple[str, ...]  # the leaderboard's columns, `score` first
    log: str  # its append-only result log in the run directory
    key: str | tuple[str, ...]  # what identifies a row of that log (icqs.io.ResultWriter)
    compute: Callable  # (engine, task, candidates, writer, sampler, progress) -> None: the missing rows
    requests: Callable  # (task, candidates, sampler) -> [PlannedRequest]: what it sends the engine, for the length
    #                    check
    score: Callable  # (task, candidates, rows, sampler) -> one dict per candidate, or None while rows are missing
    curves: bool = False  # the report plots its log-likelihood against the ratio
    demos: bool = True  # its scores depend on the demo draw (a run scores it once per draw)
    cost: int = 0  # its engine work, in order (0: one request per candidate): the headline's tie-break
    names: tuple[tuple[str, str], ...] = ()  # (measure, display name) where MEASURE_NAMES' is not the right one
    by_rank: bool = False  # unbounded scores (log-likelihoods): the leaderboard averages rank shares, not raw values


def _repeats(task, epistemic: bool) -> int:
    return task.L if epistemic else 1


def _loglik_compute(epistemic: bool):
    def compute(engine, task, candidates, writer, sampler, progress):
        scoring.compute_loglik(engine, task, candidates, writer, sampler, _repeats(task, epistemic), progress=progress)

    return compute


def _loglik_requests(epistemic: bool):
    def requests(task, candidates, sampler):
        out = []
        for s in [s for per_l in demo_sets(task, sampler, _repeats(task, epistemic)) for s in per_l]:
            demos = task.demo_text(list(s.examples))
            requests = scoring.mixture_requests(task, [s], candidates)
            if task.calibrate:  # the same answers after the content-free input
                requests += scoring.mixture_requests(task, [s], candidates, x=task.content_free)
            for c, (ctx, cont) in zip(candidates * (2 if task.calibrate else 1), requests):
                shared = demos if ctx.startswith(demos) else ""
                out.append(PlannedRequest(c, shared, ctx[len(shared) :], cont))
        return out

    return requests


def _loglik_score(epistemic: bool):
    def score(task, candidates, rows, sampler):
        return scoring.method_scores(rows, candidates, task, sampler, epistemic=epistemic)

    return score


def _by_id(candidates, rows) -> dict | None:
    by_id = {r["id"]: r for r in rows}
    return by_id if all(c.id in by_id for c in candidates) else None


def _zeroshot_requests(task, candidates, sampler):
    out = []
    for c in candidates:
        context, continuation = baselines.zeroshot_request(task, c)
        head = task.demo_text([])
        out.append(PlannedRequest(c, head, context[len(head) :], continuation))
    return out


def _zeroshot_compute(engine, task, candidates, writer, sampler, progress):
    baselines.compute_zeroshot(engine, task, candidates, writer, progress=progress)


def _zeroshot_score(normalized: bool):
    def score(task, candidates, rows, sampler):
        by_id = _by_id(candidates, rows)
        return (
            None if by_id is None else [baselines.zeroshot_score(task, c, by_id[c.id], normalized) for c in candidates]
        )

    return score


def _fewshot_score(task, candidates, rows, sampler):
    table = scoring.loglik_table(rows, candidates, sampler, task.L, task.M + 1)
    return baselines.fewshot_scores(task, candidates, table, scoring.answer_tokens(rows, sampler))


def _icl_requests(task, candidates, sampler):
    demos = task.demo_text(list(demo_sets(task, sampler, repeats=1)[0][task.M].examples))
    return [
        PlannedRequest(c, demos, baselines.icl_prompt(task, "", c), task.y_part(label))
        for c in candidates
        for label in task.labels
    ]


def _icl_score(task, candidates, rows, sampler):
    by_id = _by_id(candidates, rows)
    return None if by_id is None else [baselines.icl_score(task, c, by_id[c.id]) for c in candidates]


def _judge_requests(task, candidates, sampler):
    return [
        PlannedRequest(c, "", baselines.judge_prompt(task, c), option, generated=4)  # compute_judge's max_tokens
        for c in candidates
        for option in baselines.RATING_OPTIONS
    ]


def _judge_score(task, candidates, rows, sampler):
    by_id = _by_id(candidates, rows)
    return None if by_id is None else [baselines.judge_score(by_id[c.id]) for c in candidates]


EXPLAIN = {
    "loglik": (
        "The answer's log-likelihood after the header and the question, with no demos: log P(y | x), summed "
        "over its tokens (lm-evaluation-harness's acc, read as a score). It favours short answers; the "
        "normalised form (loglik_norm) does not. The leaderboard shows each model's mean rank share: the "
        "chance that one of its answers scores above a random answer of any model (0.5 = middling), which a "
        "few extreme log-likelihoods cannot sway as they would a raw mean."
    ),
    "loglik_norm": (
        "The zero-shot log-likelihood of the answer divided by its length: per token (score) and per "
        "byte (per_byte, lm-evaluation-harness's acc_norm). Higher: the model finds the answer more "
        "natural for the question without any demos. Leaderboard: mean rank shares, as for loglik."
    ),
    "fewshot": (
        "The answer's log-likelihood per token (score) and per byte (per_byte) after the all-good demo "
        "sets (ratio r = 1, the very sets ICQS scores; mean over the L sets): few-shot likelihood, read "
        "from the ICQS log at no extra engine work. Leaderboard: mean rank shares, as for loglik."
    ),
    "icqs": (
        "Each answer is scored after demo sets whose share r of right answers runs from 0 to 1. score is the r "
        "whose demos make the answer most likely (the paper's argmax); E[r] is the mean of r under the posterior "
        "softmax(log-likelihoods), a smoother number. In the curves (mean log-likelihood against r, one line per "
        "truth group): lines that slope apart (truth 1 up, truth 0 down) are what ICQS reads, and the better it "
        "works the more they do. Parallel lines far apart mean the model tells right from wrong WITHOUT the "
        "demos (the likelihood baselines read that gap; ICQS's ratio, which reads only the slope, cannot); "
        "lines on top of each other mean it does not tell them apart at all; lines sloping together the wrong "
        "way round (truth 0 rising more) mean ICQS is inverted. Below each plot: this run's reading."
    ),
    "epistemic": (
        "As ICQS, with the log-likelihood curve averaged over the L demo sets of each ratio before score "
        "and E[r] are read: less sensitive to one unlucky demo set."
    ),
    "icl": (
        "The all-right demo set (ratio 1) before each question; the model's most likely label is its "
        "prediction. score is 1 when the candidate's answer agrees with it, else 0; p_label is the probability "
        "the model gives the candidate's own answer. Label tasks only."
    ),
    "judge": (
        "The model is asked to rate the answer 1-5. score is the expected rating from the rating tokens' "
        "probabilities, mapped to [0, 1]; generated is the rating parsed from its own text (unparsable: "
        "unscored, never 0). Small models often rate every answer alike: check the audit."
    ),
}
ICQS_MEASURES = ("score", "expected", "score_cal", "expected_cal")  # calibrated ones: with the task's calibrate
ZEROSHOT_LOG, ZEROSHOT_KEY = "zeroshot.jsonl", "id"
METHODS = {
    m.name: m
    for m in (
        Method(
            "loglik",
            "zero-shot log-likelihood (sum over the answer's tokens, no demos)",
            ("score",),
            ZEROSHOT_LOG,
            ZEROSHOT_KEY,
            _zeroshot_compute,
            _zeroshot_requests,
            _zeroshot_score(False),
            demos=False,
            cost=0,
            by_rank=True,
        ),
        Method(
            "loglik_norm",
            "zero-shot log-likelihood per token (score) and per byte (acc_norm), no demos",
            ("score", "per_byte"),
            ZEROSHOT_LOG,
            ZEROSHOT_KEY,
            _zeroshot_compute,
            _zeroshot_requests,
            _zeroshot_score(True),
            demos=False,
            cost=0,
            names=(("score", "per token"),),
            by_rank=True,
        ),
        Method(
            "fewshot",
            "few-shot log-likelihood per token after the all-good demo sets (r = 1, mean over L)",
            ("score", "per_byte"),
            "loglik.jsonl",
            ("sampler", "l", "id"),
            _loglik_compute(True),
            _loglik_requests(True),
            _fewshot_score,
            cost=1,
            names=(("score", "per token"),),
            by_rank=True,
        ),
        Method(
            "icqs",
            "ICQS (argmax ratio; E[r] = posterior mean)",
            ICQS_MEASURES,
            "loglik.jsonl",
            ("sampler", "l", "id"),
            _loglik_compute(False),
            _loglik_requests(False),
            _loglik_score(False),
            curves=True,
            cost=2,
        ),
        Method(
            "epistemic",
            "ICQS-Epistemic (mean over L sets)",
            ICQS_MEASURES,
            "loglik.jsonl",
            ("sampler", "l", "id"),
            _loglik_compute(True),
            _loglik_requests(True),
            _loglik_score(True),
            curves=True,
            cost=3,
        ),
        Method(
            "icl",
            "plain ICL (agreement with the ICL label; p_label = its probability)",
            ("score", "p_label"),
            "icl.jsonl",
            "id",
            lambda engine, task, candidates, writer, sampler, progress: baselines.compute_icl(
                engine, task, candidates, writer, sampler, progress=progress
            ),
            _icl_requests,
            _icl_score,
            cost=1,
        ),
        Method(
            "judge",
            "verbalized judge (expected rating from rating-token log-probs; generated = parsed text)",
            ("score", "generated_score"),
            "judge.jsonl",
            "id",
            lambda engine, task, candidates, writer, sampler, progress: baselines.compute_judge(
                engine, task, candidates, writer, progress=progress
            ),
            _judge_requests,
            _judge_score,
            demos=False,
            cost=4,
        ),
    )
}
# What `icqs score` runs unless told otherwise: the likelihood baselines and ICQS (all from one set of demo sets and
# one zero-shot request per candidate); the judge (a generation per answer) and plain ICL (label tasks) on request.
DEFAULT_METHODS = ("loglik", "loglik_norm", "fewshot", "icqs", "epistemic")
MEASURE_NAMES = {
    "score": "score",
    "expected": "E[r]",
    "score_cal": "calibrated",
    "expected_cal": "E[r] cal",
    "p_label": "p_label",
    "generated_score": "generated",
    "per_byte": "per byte",
}


def measure_name(method: str, measure: str) -> str:
    """How a method's measure is shown (loglik_norm's `score` is its per-token log-likelihood)."""
    return (
        dict(METHODS[method].names).get(measure, MEASURE_NAMES.get(measure, measure))
        if method in METHODS
        else MEASURE_NAMES.get(measure, measure)
    )


def ordered(methods) -> list[str]:
    """The given method names in the registry's order."""
    return [m for m in METHODS if m in methods]
