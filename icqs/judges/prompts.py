"""The judge prompts of the many-shot ICL judge paper (Tables 1, 3, 5) and the MT-Bench pairwise prompt (Table 2).

Single answer grading: the zero-shot Prompt B asks for JSON {"rating": "", "reason": ""}. Many-shot Reinforced
ICL (Table 1) puts K solved Problems (question, response, model-generated Solution) before the final Problem;
many-shot Unsupervised ICL (Table 5) puts a preamble and K unsolved Problems, then 4 solved ones. A K-shot prompt
uses the first K demos of one draw, so it contains every demo of the smaller prompts in the same order: the
prompts of one draw share their prefixes, which the engine's prefix tree computes once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

GRADING_INSTRUCTION = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant to the "
    "user question displayed below. Your evaluation should consider factors such as the helpfulness, relevance, "
    "accuracy, depth, creativity, and level of detail of the response. Please rate the response on a scale of 1 to "
    '10 by strictly following this JSON format: {"rating":"", "reason":""}. The "rating" should be as objective as '
    'possible. The "reason" denotes a comprehensive explanation of your rating, which should consider factors such '
    "as helpfulness, relevance, accuracy, depth, creativity, and level of detail of the response should also be "
    "considered. Only return the JSON results and do not give any explanation."
)
REINFORCED_PREAMBLE = (
    "Now, I am going to give you a series of demonstrations of Problems and Solutions. When you respond, respond "
    "only with the Solution of the final Problem, thinking step by step."
)
UNSUPERVISED_PREAMBLE = "You will be provided Problems similar to the ones below:"

# The judge's answer begins with this; the rating is read as the continuation `<r>"` for r in 1..10.
RATING_PREFIX = '{"rating": "'


@dataclass(frozen=True)
class Demo:
    """One in-context example: a question, a response, and (for solved demos) the judge's Solution text."""

    question: str
    response: str
    solution: str | None = None


def solution_text(rating: int, reason: str) -> str:
    """A Solution in the canonical JSON form, which starts with RATING_PREFIX."""
    return RATING_PREFIX + f'{rating}", "reason": ' + json.dumps(reason.strip(), ensure_ascii=False) + "}"


def grading_problem(question: str, response: str) -> str:
    """Prompt B: the zero-shot single answer grading prompt."""
    return f"{GRADING_INSTRUCTION}\n\nQuestion\n\n{question}\n\nResponse\n\n{response}"


def _problem(demo: Demo, solved: bool) -> str:
    text = f"Problem\n\n{grading_problem(demo.question, demo.response)}"
    if solved:
        if demo.solution is None:
            raise ValueError("a solved demo needs a solution")
        text += f"\n\nSolution\n\n{demo.solution}"
    return text + "\n\n"


def _final(question: str, response: str) -> str:
    return f"Problem\n\n{grading_problem(question, response)}\n\nSolution"


def reinforced_prompt(question: str, response: str, demos: list[Demo], k: int) -> str:
    """K-shot Reinforced ICL (Table 1): the first k solved demos, then the final Problem. k == 0 is Prompt B."""
    if k == 0:
        return grading_problem(question, response)
    if k > len(demos):
        raise ValueError(f"{k}-shot prompt needs {k} demos, have {len(demos)}")
    return REINFORCED_PREAMBLE + "\n\n" + "".join(_problem(d, True) for d in demos[:k]) + _final(question, response)


UNSUPERVISED_SOLVED = 4  # the paper appends 4 solved demos to fix the output format


def unsupervised_prompt(question: str, response: str, demos: list[Demo], k: int) -> str:
    """K-shot Unsupervised ICL (Table 5): preamble, the first k demos as unsolved Problems, then the Reinforced ICL
    prompt with the first 4 demos solved. k == 0 is Prompt B."""
    if k == 0:
        return grading_problem(question, response)
    if max(k, UNSUPERVISED_SOLVED) > len(demos):
        raise ValueError(f"{k}-shot unsupervised prompt needs {max(k, UNSUPERVISED_SOLVED)} demos, have {len(demos)}")
    unsolved = "".join(_problem(d, False) for d in demos[:k])
    return UNSUPERVISED_PREAMBLE + "\n\n" + unsolved + reinforced_prompt(question, response, demos, UNSUPERVISED_SOLVED)


PROMPTS = {"reinforced": reinforced_prompt, "unsupervised": unsupervised_prompt}

# MT-Bench pairwise comparison (Zheng et al., 2023), as in the paper's Table 2.
PAIRWISE_INSTRUCTION = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to "
    "the user question displayed below. You should choose the assistant that follows the user's instructions and "
    "answers the user's question better. Your evaluation should consider factors such as the helpfulness, "
    "relevance, accuracy, depth, creativity, and level of detail of their responses. Begin your evaluation by "
    "comparing the two responses and provide a short explanation. Avoid any position biases and ensure that the "
    "order in which the responses were presented does not influence your decision. Do not allow the length of the "
    "responses to influence your evaluation. Do not favor certain names of the assistants. Be as objective as "
    "possible. After providing your explanation, output your final verdict by strictly following this format: "
    '"[[A]]" if assistant A is better, "[[B]]" if assistant B is better, and "[[C]]" for a tie.'
)
# The verdict is read as the continuation "[[A]]" / "[[B]]" / "[[C]]" after this.
VERDICT_PREFIX = "My final verdict is: "


NO_TIE = (
    '"[[A]]" if assistant A is better, "[[B]]" if assistant B is better, and "[[C]]" for a tie.',
    '"[[A]]" if assistant A is better and "[[B]]" if assistant B is better; a tie is not allowed.',
)


def pairwise_instruction(tie: bool = True, rubric: str | None = None) -> str:
    """The instruction, with the tie option or without it (--no-tie), and a rubric appended (--rubric)."""
    text = PAIRWISE_INSTRUCTION if tie else PAIRWISE_INSTRUCTION.replace(*NO_TIE)
    return text + (f"\n\nJudge by this rubric:\n{rubric.strip()}" if rubric else "")


def pairwise_prompt(
    question: str, first: str, second: str, labels: tuple[str, str], tie: bool = True, rubric: str | None = None
) -> str:
    """The pairwise prompt with `first` shown first as assistant labels[0] and `second` as labels[1]."""
    return (
        f"{pairwise_instruction(tie, rubric)}\n\n[User Question]\n{question}\n\n"
        f"[The Start of Assistant {labels[0]}'s Answer]\n{first}\n[The End of Assistant {labels[0]}'s Answer]\n\n"
        f"[The Start of Assistant {labels[1]}'s Answer]\n{second}\n[The End of Assistant {labels[1]}'s Answer]"
    )


def chat_wrap(tokenizer, user_text: str, answer_prefix: str = "") -> str:
    """The user message in the model's chat template (when it has one), followed by the start of the answer."""
    if getattr(tokenizer, "chat_template", None):
        head = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True)
    else:
        head = user_text + "\n\n"
    return head + answer_prefix
