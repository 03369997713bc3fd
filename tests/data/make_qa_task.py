"""Writes tests/data/qa_task.yaml and tests/data/qa_candidates.jsonl: a small free-text task as a new user would
bring one (issue 39). 12 short factual and arithmetic questions answered by 4 simulated models whose accuracies are
11/12, 8/12, 5/12 and 2/12 (92/67/42/17%), each wrong answer a plausible one; the task's pool holds 12 right
answers and 12 wrong answers to 24 other questions. Deterministic: rerun it to regenerate the same files.

    python tests/data/make_qa_task.py
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

# (question, right answer, plausible wrong answers)
QUESTIONS = [
    ("What is 7 + 5?", "12", ["13", "11", "14"]),
    ("What is the capital of France?", "Paris", ["Lyon", "London", "Marseille"]),
    ("How many legs does a spider have?", "8", ["6", "10", "4"]),
    ("What is 9 times 3?", "27", ["24", "30", "21"]),
    ("Which planet is known as the Red Planet?", "Mars", ["Venus", "Jupiter", "Saturn"]),
    (
        "What is the largest ocean on Earth?",
        "the Pacific Ocean",
        ["the Atlantic Ocean", "the Indian Ocean", "the Arctic Ocean"],
    ),
    ("What is 100 minus 37?", "63", ["73", "67", "53"]),
    ("Who wrote Romeo and Juliet?", "William Shakespeare", ["Charles Dickens", "Mark Twain", "Jane Austen"]),
    ("How many minutes are in an hour?", "60", ["100", "30", "50"]),
    ("What is the chemical symbol for water?", "H2O", ["CO2", "O2", "HO2"]),
    ("What is half of 50?", "25", ["20", "15", "30"]),
    ("What is the capital of Japan?", "Tokyo", ["Kyoto", "Osaka", "Beijing"]),
]
GOOD = [  # other questions, right answers
    ("What is 4 + 4?", "8"),
    ("What is the capital of Italy?", "Rome"),
    ("How many days are in a week?", "7"),
    ("What is 6 times 7?", "42"),
    ("Which animal is known as the king of the jungle?", "the lion"),
    ("What is the boiling point of water in degrees Celsius?", "100"),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("What is 20 divided by 4?", "5"),
    ("What is the capital of Germany?", "Berlin"),
    ("How many sides does a triangle have?", "3"),
    ("What gas do plants take in from the air?", "carbon dioxide"),
    ("What is 15 + 10?", "25"),
]
BAD = [  # yet other questions, wrong answers
    ("What is 3 + 5?", "9"),
    ("What is the capital of Spain?", "Lisbon"),
    ("How many months are in a year?", "10"),
    ("What is 8 times 8?", "56"),
    ("Which is the largest planet in the solar system?", "Mars"),
    ("What is the freezing point of water in degrees Celsius?", "10"),
    ("Who developed the theory of relativity?", "Isaac Newton"),
    ("What is 30 divided by 5?", "5"),
    ("What is the capital of Canada?", "Toronto"),
    ("How many sides does a square have?", "5"),
    ("What is the largest mammal?", "the elephant"),
    ("What is 12 + 9?", "20"),
]
# model -> the questions it answers right (accuracies 11/12, 8/12, 5/12, 2/12)
MODELS = {
    "model-A": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    "model-B": [0, 1, 3, 4, 6, 8, 9, 11],
    "model-C": [1, 2, 5, 7, 10],
    "model-D": [4, 9],
}


def task() -> dict:
    return {
        "name": "qa-free-text",
        "header": "Answer each question in a few words.",
        "template": "Question: {x}\nAnswer: {y}",
        "good": [{"x": x, "y": y} for x, y in GOOD],
        "bad": [{"x": x, "y": y} for x, y in BAD],
    }


def candidates() -> list[dict]:
    rows = []
    for k, (model, right) in enumerate(MODELS.items()):
        for q, (x, y, wrong) in enumerate(QUESTIONS):
            ok = q in right
            rows.append(
                {
                    "id": f"{model}/q{q}",
                    "model": model,
                    "x": x,
                    "y": y if ok else wrong[(q + k) % len(wrong)],
                    "truth": 1 if ok else 0,
                }
            )
    return rows


def main() -> None:
    (HERE / "qa_task.yaml").write_text(
        "# written by make_qa_task.py\n" + yaml.safe_dump(task(), sort_keys=False, allow_unicode=True, width=120)
    )
    (HERE / "qa_candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in candidates()))


if __name__ == "__main__":
    main()
