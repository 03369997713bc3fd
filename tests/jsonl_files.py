"""Writing JSONL input files for the command-line tests."""

import json

# pairwise judge inputs: three questions, model_a right each time (the judge tests' and the run-dir tests' pairs)
PAIRS = [
    {
        "id": f"p{n}",
        "question": f"What is {n} + {n}?",
        "answer_a": f"It is {2 * n}.",
        "answer_b": "No idea.",
        "model_a": "m1",
        "model_b": "m2",
        "winner": "model_a",
    }
    for n in range(3)
]


def write_jsonl(path, rows) -> str:
    """rows as one JSON object per line at path; returns the path as a string (a command-line argument)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_label_task(root, L: int = 2):
    """A yes/no label task of 8 good and 8 bad pool answers (task.yaml) and 6 candidates of two models with
    their truth (c.jsonl) in folder `root`; returns root."""
    good = [{"x": f"item {i}", "y": ["no", "yes"][i % 2]} for i in range(8)]
    bad = [{"x": f"item {i}", "y": ["yes", "no"][i % 2]} for i in range(8, 16)]
    (root / "task.yaml").write_text(
        json.dumps(
            {
                "name": "t",
                "template": "Q: {x}\nA: {y}",
                "good": good,
                "bad": bad,
                "labels": ["no", "yes"],
                "M": 2,
                "N": 2,
                "L": L,
            }
        )
    )
    write_jsonl(
        root / "c.jsonl",
        [
            {"id": f"{m}{q}", "model": m, "x": f"q {q}", "y": y, "truth": t}
            for m, y, t in (("m1", "yes", 1), ("m2", "no", 0))
            for q in range(3)
        ],
    )
    return root
