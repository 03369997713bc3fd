"""`icqs demo`: a built-in task the project generates itself (no third-party data) and simulated models with known
accuracies, scored by ICQS, ICQS-Epistemic, plain ICL and the verbalized judge on the embedded model.

The task: the sentiment of short generated reviews ("The soundtrack was a joy to watch."). Z_g holds reviews with
their true label, Z_b other reviews with the label flipped. Four simulated models answer the same test reviews,
each correct on exactly a known share of them (1.0, 0.8, 0.6, 0.4): the true ranking is known, and the
leaderboard prints it beside each method's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np
import yaml

from .candidates import Candidate
from .io import atomic_write
from .task import Example, Task

SUBJECTS = [
    "The movie",
    "This film",
    "The acting",
    "The story",
    "The soundtrack",
    "The ending",
    "The dialogue",
    "The sequel",
    "The cast",
    "The plot",
    "This show",
    "The new series",
]
POSITIVE = [
    "was wonderful",
    "was a joy to watch",
    "made me smile all evening",
    "was brilliant",
    "was beautiful and moving",
    "was delightful",
    "is a true masterpiece",
    "was fun from start to finish",
    "deserves every award",
    "left me happy and inspired",
]
NEGATIVE = [
    "was terrible",
    "was a waste of time",
    "bored me to tears",
    "was awful",
    "was dull and lifeless",
    "made me angry",
    "is a complete mess",
    "was painful to sit through",
    "deserves to be forgotten",
    "left me sad and disappointed",
]
LABELS = ["negative", "positive"]
MODELS = {"model-A": 1.0, "model-B": 0.8, "model-C": 0.6, "model-D": 0.4}
SIZES = {"pool": 16, "questions": 20, "M": 4, "N": 10, "L": 2}


def reviews(seed: int = 0) -> list[Example]:
    """Every subject x predicate review with its true label, in a fixed random order."""
    pairs = [(s, p, "positive") for s, p in itertools.product(SUBJECTS, POSITIVE)]
    pairs += [(s, p, "negative") for s, p in itertools.product(SUBJECTS, NEGATIVE)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [Example(f"{pairs[i][0]} {pairs[i][1]}.", pairs[i][2]) for i in order]


def _flip(label: str) -> str:
    return LABELS[1 - LABELS.index(label)]


def demo_task(pool: int = SIZES["pool"], M: int = SIZES["M"], N: int = SIZES["N"], L: int = SIZES["L"]) -> Task:
    all_reviews = reviews()
    good = all_reviews[:pool]
    bad = [Example(e.x, _flip(e.y)) for e in all_reviews[pool : 2 * pool]]
    return Task(
        "demo-review-sentiment",
        "Review: {x}\nSentiment: {y}",
        good,
        bad,
        labels=list(LABELS),
        judge_question="Is the sentiment of the following review 'negative' or 'positive': {x}\n"
        "Respond with 'negative' or 'positive'.",
        M=M,
        N=N,
        L=L,
        seed=0,
    )


def demo_candidates(task: Task, questions: int = SIZES["questions"], seed: int = 1) -> list[Candidate]:
    """Each simulated model answers the same held-out reviews, right on exactly round(accuracy * questions)."""
    held_out = reviews()[len(task.good) + len(task.bad) :][:questions]
    rng = np.random.default_rng(seed)
    out = []
    for model, accuracy in MODELS.items():
        right = set(rng.permutation(questions)[: round(accuracy * questions)].tolist())
        for q, e in enumerate(held_out):
            ok = q in right
            out.append(Candidate(f"{model}/q{q}", model, e.x, e.y if ok else _flip(e.y), 1.0 if ok else 0.0))
    return out


def task_yaml(task: Task) -> str:
    d = {
        "name": task.name,
        "template": task.template,
        "labels": task.labels,
        "judge_question": task.judge_question,
        "M": task.M,
        "N": task.N,
        "L": task.L,
        "seed": task.seed,
        "good": [{"x": e.x, "y": e.y} for e in task.good],
        "bad": [{"x": e.x, "y": e.y} for e in task.bad],
    }
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=120)


# Wall time of `icqs demo` (3 draws, every method) on a 2-core AMD EPYC (Zen4, avx512_bf16) shared with other jobs
# (load average 5-6): 138 s, of which the audit took 65% of the engine's 108 s; without the audit about 70 s. The
# banner scales these seconds by the draws.
DEMO_SECONDS = {"audit": 140, "no_audit": 70}


def banner(args, draws: int, audit: bool) -> str:
    """The line `icqs demo` starts with: what it does, on which model, and about how long it takes."""
    model = f"the model {args.model}" if getattr(args, "model", None) else "the embedded SmolLM2-135M-Instruct"
    if getattr(args, "server", None):
        model = f"the server {args.server}"
    seconds = DEMO_SECONDS["audit" if audit else "no_audit"] * draws / 3
    return (
        f"icqs demo: 4 simulated models answer {SIZES['questions']} generated movie reviews (right on "
        f"{', '.join(f'{a:.0%}' for a in MODELS.values())}); the likelihood baselines, ICQS, ICQS-Epistemic, "
        f"plain ICL and a verbalized judge on {model} rank them{', each method audited,' if audit else ''} and the leaderboard shows the "
        f"true ranking beside theirs; about {max(1, round(seconds / 60))} min on 2 CPU cores"
        + ("" if model.startswith("the embedded") else " with the embedded model")
    )


def run_demo(out, args=None, progress: bool = True) -> str:
    """Score the demo, print the leaderboard (true ranking beside it) and write the report; returns the text."""
    from commands.factory import add_engine_args, engine_from_args, model_label

    from .methods import METHODS
    from .report import write_report
    from .run_dirs import ScoreRun
    from .score_run import describe_model, record_headline, score_run, score_run_dir

    if args is None:  # the defaults of `icqs demo`
        parser = argparse.ArgumentParser()
        add_engine_args(parser)
        args = parser.parse_args([])
    draws, audit = getattr(args, "draws", 3), not getattr(args, "no_audit", False)
    task = demo_task()
    candidates = demo_candidates(task)
    run = score_run_dir(out, task, candidates, model_label(args), "coupled", METHODS, draws)  # nothing written yet
    engine = engine_from_args(args, keep_cache=True)
    if progress:  # once the options and the model are checked: a bad one is a single error line
        print(banner(args, draws, audit), file=sys.stderr, flush=True)
    rows = score_run(
        engine,
        task,
        candidates,
        run,
        METHODS,
        "coupled",
        progress=progress,
        draws=draws,
        audit=audit,
        model_info=describe_model(getattr(args, "server", None) or getattr(args, "model", None), engine),
    )
    with run.start():
        atomic_write(run.path / "demo_task.yaml", task_yaml(task))  # `icqs score` reruns it with candidates.jsonl
        section = ScoreRun(run.path).leaderboard_of(task, rows, run.meta)
        record_headline(run, section.data["headline"])
        text = section.text
        print(text.rstrip("\n"))
        for line in section.warnings:
            print(line, file=sys.stderr)
        print(f"true accuracies: {', '.join(f'{m} {a:.1f}' for m, a in MODELS.items())}")
        print(f"report: {write_report(run.path)}")
    return text


EXAMPLE_HEADER = """\
# An ICQS task (`icqs schema task` lists every field). ICQS scores an answer by how much more likely the model finds
# it after demos that are mostly right than after demos that are mostly wrong: `good` holds inputs with their RIGHT
# answer, `bad` inputs with a WRONG answer. Texts are YAML strings: quote yes/no/true/null/numbers ("no", "3").
"""


def write_example(folder) -> list:
    """`icqs init DIR`: a small working label task (DIR/task.yaml, 12 good and 12 bad reviews) and answers of three
    simulated models to 8 held-out reviews (DIR/candidates.jsonl, with their truth); refuses to overwrite."""
    from pathlib import Path

    from engine.errors import UserError

    folder = Path(folder)
    paths = [folder / "task.yaml", folder / "candidates.jsonl"]
    for p in paths:
        if p.exists():
            raise UserError("exists; `icqs init` does not overwrite files (choose another folder)", str(p))
    if folder.exists() and not folder.is_dir():
        raise UserError("is a file, not a folder", str(folder))
    task = demo_task(pool=12, M=2, N=4, L=2)
    task.name = "review-sentiment"
    held_out = reviews()[24:32]
    rng = np.random.default_rng(3)
    rows = []
    for model, accuracy in (("model-a", 0.9), ("model-b", 0.6), ("model-c", 0.3)):
        right = set(rng.permutation(len(held_out))[: round(accuracy * len(held_out))].tolist())
        for q, e in enumerate(held_out):
            ok = q in right
            rows.append(
                {
                    "id": f"{model}/q{q}",
                    "model": model,
                    "x": e.x,
                    "y": e.y if ok else _flip(e.y),
                    "truth": 1 if ok else 0,
                }
            )
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(paths[0], EXAMPLE_HEADER + task_yaml(task))
    atomic_write(paths[1], "".join(json.dumps(r) + "\n" for r in rows))
    return paths
