"""The label tasks of issue 39's before/after table, written as `icqs score` inputs: a yes/no task (BIG-bench
`entailed_polarity`) and a 3-way NLI task (BIG-bench `presuppositions_as_nli`), each with a pool of 12 right and
12 wrong answers (every label the same share of each pool) and 12 held-out questions answered by 4 simulated
models right on 11, 8, 5 and 2 of them (92, 67, 42, 17%), as tests/data/make_qa_task.py does for the free-text task. The data come from the `bigbench==1.0.0` sdist
on PyPI (cached in the user cache on first use).

    python benchmarks/icqs_issue39_tasks.py OUT_DIR      # OUT_DIR/{yesno,nli}/{task.yaml,candidates.jsonl}
    icqs score OUT_DIR/yesno/task.yaml OUT_DIR/yesno/candidates.jsonl --out RUN [--model qwen2.5-0.5b]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commands.fetch import fetch_package_file

TASKS = {"yesno": ("entailed_polarity", "{x}\nAnswer: {y}"), "nli": ("presuppositions_as_nli", "{x}\nAnswer: {y}")}
RIGHT = {"model-A": 11, "model-B": 8, "model-C": 5, "model-D": 2}


def examples(name: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    data = json.loads(
        fetch_package_file("bigbench==1.0.0", f"bigbench/benchmark_tasks/{name}/task.json", sdist=True).read_text(
            encoding="utf-8"
        )
    )
    rows = []
    for e in data["examples"]:
        x = " ".join(e["input"].replace("The answer is:", "").split())
        rows.append((x, max(e["target_scores"], key=e["target_scores"].get)))
    labels = sorted({y for _, y in rows})
    return data.get("task_prefix", "").strip(), rows, labels


def pools(rows: list[tuple[str, str]], labels: list[str], size: int = 12) -> tuple[list, list, list]:
    """(good, bad, test) rows, taken in the rows' order: every label the same share of the good answers and of the bad
    answers (`size // len(labels)` each; a bad answer shows a label other than its right one), so that every fold of
    the label-stratified audit holds every label on both sides (a label missing from a fold's bad pool makes the
    label-balanced demo sets impossible and the audit skips the method); the test questions the same way (every right
    label `per` times, so that a score following the label does not follow the candidates' truth)."""
    per = size // len(labels)
    good, bad, test = [], [], []
    for x, y in rows:
        if sum(g == y for _, g in good) < per:
            good.append((x, y))
            continue
        options = [lab for lab in labels if lab != y and sum(b == lab for _, b in bad) < per]
        if options:
            bad.append((x, min(options, key=lambda lab: (sum(b == lab for _, b in bad), labels.index(lab)))))
        elif sum(t == y for _, t in test) < per:
            test.append((x, y))
    if min(len(good), len(bad), len(test)) < per * len(labels):
        raise ValueError(
            f"too few examples for {size} good, {size} bad and {size} test questions with every label "
            f"{per} times in each"
        )
    return good, bad, test


def build(key: str, seed: int = 0) -> tuple[dict, list[dict]]:
    name, template = TASKS[key]
    prefix, rows, labels = examples(name)
    return build_from_rows(name, prefix, template, rows, labels, seed)


def build_from_rows(
    name: str, prefix: str, template: str, rows: list[tuple[str, str]], labels: list[str], seed: int = 0
) -> tuple[dict, list[dict]]:
    """The task (a label-balanced pool of 12 good and 12 bad answers, pools()) and the candidates: 12 held-out
    questions answered by the simulated models of RIGHT."""
    rng = np.random.default_rng(seed)
    rows = [rows[i] for i in rng.permutation(len(rows))]
    wrong = lambda y, k: [lab for lab in labels if lab != y][k % (len(labels) - 1)]
    good, bad, test = pools(rows, labels)
    task = {
        "name": f"bigbench-{name}",
        "header": prefix,
        "template": template,
        "labels": labels,
        "good": [{"x": x, "y": y} for x, y in good],
        "bad": [{"x": x, "y": y} for x, y in bad],
    }
    cands = []
    for k, (model, n_right) in enumerate(RIGHT.items()):
        right = set(rng.permutation(12)[:n_right].tolist())
        for q, (x, y) in enumerate(test):
            ok = q in right
            cands.append(
                {"id": f"{model}/q{q}", "model": model, "x": x, "y": y if ok else wrong(y, q + k), "truth": int(ok)}
            )
    return task, cands


def main() -> None:
    out = Path(sys.argv[1])
    for key in TASKS:
        task, cands = build(key)
        (out / key).mkdir(parents=True, exist_ok=True)
        (out / key / "task.yaml").write_text(yaml.safe_dump(task, sort_keys=False, allow_unicode=True, width=120))
        (out / key / "candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cands))
        print(out / key)


if __name__ == "__main__":
    main()
