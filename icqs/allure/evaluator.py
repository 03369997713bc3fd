"""The evaluator LLM: labels each (task, response) item 1 (correct) or 0 (incorrect), given the ICL examples of its
memory as prior turns of the chat.

The label is read from the log-probs of the label tokens (icqs.options.option_logprobs): both label continuations
are scored after a prompt ending in the label prefix, so every item gets P(label = 1), the score AUC needs, and the
label is the likelier one. All items share the system message and the ICL turns, which the engine's prefix tree
computes once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icqs.options import option_logprobs

from .template import LABELS, Template


@dataclass
class Labels:
    p_correct: np.ndarray  # P(label = 1) for each item, renormalised over the two labels
    labels: np.ndarray  # argmax label, 1 when P(label = 1) >= 0.5


class Evaluator:
    def __init__(self, engine, template: Template, progress: bool = False):
        self.engine, self.template, self.progress = engine, template, progress

    def prompts(self, items: list[dict], examples: list[tuple[str, str]]) -> list[str]:
        tok = self.engine.tokenizer
        return [self.template.prompt(tok, examples, item) for item in items]

    def label(self, items: list[dict], examples: list[tuple[str, str]]) -> Labels:
        """Label every item with the given ICL examples ((user, assistant) turns, in prompt order)."""
        if not items:
            return Labels(np.zeros(0), np.zeros(0, dtype=int))
        lp = option_logprobs(
            self.engine, self.prompts(items, examples), self.template.options, normalize=True, progress=self.progress
        )
        p = np.exp(lp[:, LABELS.index(1)])
        return Labels(p, (p >= 0.5).astype(int))
