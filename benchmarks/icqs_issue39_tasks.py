"""The label tasks of issue 39's before/after table, written as `icqs score` inputs: a yes/no task (BIG-bench
`entailed_polarity`) and a 3-way NLI task (BIG-bench `presuppositions_as_nli`), each with a pool of 12 right and
12 wrong answers and 12 held-out questions answered by 4 simulated models right on 11, 8, 5 and 2 of them (92, 67,
42, 17%), as tests/data/make_qa_task.py does for the free-text task. The data come from the `bigbench==1.0.0` sdist
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

from commands.fetch import fetch_package_file  # noqa: E402

TASKS = {"yesno": ("entailed_polarity", "{x}\nAnswer: {y}"),
         "nli": ("presuppositions_as_nli", "{x}\nAnswer: {y}")}
RIGHT = {"model-A": 11, "model-B": 8, "model-C": 5, "model-D": 2}


def examples(name: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    data = json.loads(fetch_package_file("bigbench==1.0.0", f"bigbench/benchmark_tasks/{name}/task.json",
                                         sdist=True).read_text(encoding="utf-8"))
    rows = []
    for e in data["examples"]:
        x = " ".join(e["input"].replace("The answer is:", "").split())
        rows.append((x, max(e["target_scores"], key=e["target_scores"].get)))
    labels = sorted({y for _, y in rows})
    return data.get("task_prefix", "").strip(), rows, labels


def build(key: str, seed: int = 0) -> tuple[dict, list[dict]]:
    name, template = TASKS[key]
    prefix, rows, labels = examples(name)
    rng = np.random.default_rng(seed)
    rows = [rows[i] for i in rng.permutation(len(rows))]
    wrong = lambda y, k: [lab for lab in labels if lab != y][k % (len(labels) - 1)]  # noqa: E731
    good = rows[:12]
    bad = [(x, wrong(y, i)) for i, (x, y) in enumerate(rows[12:24])]
    test = rows[24:36]
    task = {"name": f"bigbench-{name}", "header": prefix + "\n\n", "template": template, "labels": labels,
            "good": [{"x": x, "y": y} for x, y in good], "bad": [{"x": x, "y": y} for x, y in bad]}
    cands = []
    for k, (model, n_right) in enumerate(RIGHT.items()):
        right = set(rng.permutation(12)[:n_right].tolist())
        for q, (x, y) in enumerate(test):
            ok = q in right
            cands.append({"id": f"{model}/q{q}", "model": model, "x": x, "y": y if ok else wrong(y, q + k),
                          "truth": int(ok)})
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
