"""One small run of each kind (score, judge, pairwise, ALLURE) on the embedded SmolLM2-135M, its HTML report written
by `icqs report DIR`, and screenshots of each report (headless Chromium, benchmarks/report_screenshots.py) to look
at: the reports' visual check for every run type.

    python benchmarks/run_dir_reports.py OUT_DIR [--shots docs/screenshots]

The inputs are made here: `icqs init`'s sentiment example for the score run; 18 answers to 6 questions from three
"models" (one right, one wrong, one mixed) with labels, graded by the judge and compared in 18 pairs; 12 number
answers for ALLURE. A few minutes on 2 CPU cores. The screenshots are the first two tiles of each report (1280 x 1300 px
each) saved as 8-bit palette PNGs, small enough to commit."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    ("What is 7 + 5?", "12", "13"),
    ("What is the capital of France?", "Paris", "Lyon"),
    ("How many legs does a spider have?", "Eight.", "Six."),
    ("What is 9 x 3?", "27", "24"),
    ("Which planet is the largest?", "Jupiter", "Mars"),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees.", "90 degrees."),
]
MODELS = {"careful": lambda n: 0, "sloppy": lambda n: 1, "mixed": lambda n: n % 2}  # 0: the right answer


def _answer(model: str, n: int) -> tuple[str, int]:
    q, right, wrong = QUESTIONS[n]
    wrong_one = MODELS[model](n)
    return (wrong if wrong_one else right), 1 - wrong_one


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def inputs(root: Path) -> dict:
    judge = [
        {
            "id": f"{m}/q{n}",
            "model": m,
            "question": QUESTIONS[n][0],
            "response": _answer(m, n)[0],
            "label": _answer(m, n)[1],
        }
        for m in MODELS
        for n in range(len(QUESTIONS))
    ]
    pairs = []
    names = list(MODELS)
    for n in range(len(QUESTIONS)):
        for i, a in enumerate(names):
            b = names[(i + 1) % len(names)]
            (ya, la), (yb, lb) = _answer(a, n), _answer(b, n)
            pairs.append(
                {
                    "id": f"q{n}/{a}-{b}",
                    "question": QUESTIONS[n][0],
                    "answer_a": ya,
                    "answer_b": yb,
                    "model_a": a,
                    "model_b": b,
                    "winner": "tie" if la == lb else "model_a" if la > lb else "model_b",
                }
            )
    allure = [
        {
            "id": f"n{i}",
            "question": f"What is {i} + {i}?",
            "response": f"The answer is {2 * i + (i % 3 == 0)}.",
            "answer": str(2 * i),
        }
        for i in range(12)
    ]
    return {
        "judge": _jsonl(root / "judge.jsonl", judge),
        "pairwise": _jsonl(root / "pairs.jsonl", pairs),
        "allure": _jsonl(root / "allure.jsonl", allure),
    }


def main(argv: list[str]) -> int:
    from icqs.cli import main as icqs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shots", default=None, help="also save the first two tiles of each report here (PNG)")
    ap.add_argument("--nondeterministic", action="store_true", help="passed on to the run commands")
    args = ap.parse_args(argv)
    extra = ["--nondeterministic"] if args.nondeterministic else []
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    files = inputs(root)
    assert icqs(["init", str(root / "example")]) == 0
    runs = {
        "score": ["score", str(root / "example/task.yaml"), str(root / "example/candidates.jsonl"), "--draws", "1"],
        "judge": ["judge", files["judge"], "--shots", "0,2", "--runs", "2"],
        "pairwise": ["pairwise", files["pairwise"], "--no-tie"],
        "allure": ["allure", "run", files["allure"], "--rounds", "2"],
    }
    reports = {}
    for kind, argv_ in runs.items():
        out = root / kind
        assert icqs(argv_ + ["--out", str(out), "--quiet", *extra]) == 0, kind
        assert icqs(["report", str(out)]) == 0, kind
        reports[kind] = out / "report.html"
    if args.shots:
        from PIL import Image
        from report_screenshots import screenshot

        shots = Path(args.shots)
        shots.mkdir(parents=True, exist_ok=True)
        for kind, html in reports.items():
            for k, tile in enumerate(screenshot(html, root)[:2]):
                target = shots / f"report_{kind}_{k}.png"
                Image.open(tile).convert("P", palette=Image.ADAPTIVE, colors=128).save(target, optimize=True)
                print(target, f"{target.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
