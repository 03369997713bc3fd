"""The `icqs` subcommands: each one's module (whose `register(subparsers)` adds it) and its line of help. A leaf module:
`icqs --help` and a mistyped command answer from it without importing any command, and the command modules take
their help line from it without importing icqs.cli."""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    module: str  # the module whose register(subparsers) adds it
    help: str  # its line in `icqs --help`


COMMANDS = {
    "init": Command(
        "icqs.cli", "write a small working example (task.yaml, candidates.jsonl) into a folder: start here"
    ),
    "preview": Command(
        "icqs.cli", "show the prompts, requests, tokens and time a score run would take, scoring nothing"
    ),
    "score": Command(
        "icqs.cli", "rank models by scoring their answers with ICQS and the baselines; audit and leaderboard"
    ),
    "leaderboard": Command("icqs.cli", "print the leaderboard of a run directory (score, judge, pairwise)"),
    "audit": Command("icqs.cli", "print how far a run's evaluator can be trusted"),
    "report": Command("icqs.cli", "write the HTML report of a run directory (any kind)"),
    "demo": Command("icqs.cli", "a built-in example: score four simulated models of known accuracy with every method"),
    "schema": Command("icqs.cli", "print the JSON Schema of an input format (task, candidates, judge, ...)"),
    "judge": Command("icqs.judges.cli", "grade answers 1-10 with zero-shot or many-shot ICL judge prompts"),
    "pairwise": Command("icqs.judges.cli", "compare two answers under four prompts (position x symbol swap)"),
    "allure": Command("icqs.allure.cli", "ALLURE: audit an evaluator LLM and improve it with iterative ICL"),
}
