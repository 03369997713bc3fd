"""The audit: is a response correct? Decided by regular-expression matching against the task's correct answer,
then compared with the evaluator's label to find its errors (the paper's Fig. 2, left half).

A match spec is a kind name or a dict with a "kind" and its options:
  number     the response's final number equals the answer's first number ("9 apples" ~ "... so 9 in all.");
             {"which": "last"|"first"}; a number after "answer is"/"answer:" wins over the last number
  option     the option letter ("(B)", "B)", "Answer: B", a leading "B") equals the answer's letter
  node_list  the integer sequence after the last "Answer:" (or in the whole text) equals the answer's sequence:
             "1, Left, 2" ~ "1, 2" and "Room 1, Room 3" ~ "1, 3" (the paper's cognitive-map answers)
  regex      {"pattern": ...}: the last match in the response (group 1 if any) equals the first match in the
             answer, after case-folding and collapsing whitespace
  text       the response equals the answer after normalizing (case-folding, collapsing whitespace, dropping
             punctuation at either end): "Paris." ~ "paris"; a `number` spec whose answer holds no number
             ("Paris") matches as text
  label      no matching: the item carries its human label (field "label", 1 correct / 0 incorrect)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

KINDS = ("number", "option", "node_list", "regex", "text", "label")

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:|=)?\s*:?\s*(?:\$\s*)?", re.IGNORECASE)
_OPTION_PATTERNS = [
    re.compile(r"answer\s*(?:is|:)?\s*:?\s*\(?([A-J])\)?(?![\w])", re.IGNORECASE),
    re.compile(r"\(([A-J])\)"),
    re.compile(r"(?<![\w])([A-J])\)"),
    re.compile(r"^\s*([A-J])(?![\w])"),
]
_INTEGER = re.compile(r"(?<![\w.])\d+(?![\d.])")


class MatchSpecError(ValueError):
    """A malformed match spec (the caller turns it into a UserError naming the file and line)."""


@dataclass(frozen=True)
class MatchSpec:
    kind: str
    which: str = "last"
    pattern: str | None = None

    @classmethod
    def parse(cls, spec) -> "MatchSpec":
        if isinstance(spec, MatchSpec):
            return spec
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, dict) or "kind" not in spec:
            raise MatchSpecError(f"match spec must be a kind name or a dict with 'kind', got {spec!r}")
        kind = spec["kind"]
        if kind not in KINDS:
            raise MatchSpecError(f"unknown match kind {kind!r} (known: {', '.join(KINDS)})")
        unknown = set(spec) - {"kind", "which", "pattern"}
        if unknown:
            raise MatchSpecError(f"unknown match option(s) {', '.join(sorted(unknown))}")
        which = spec.get("which", "last")
        if which not in ("last", "first"):
            raise MatchSpecError(f"'which' must be 'last' or 'first', got {which!r}")
        pattern = spec.get("pattern")
        if kind == "regex":
            if not pattern:
                raise MatchSpecError("a regex match needs a 'pattern'")
            try:
                re.compile(pattern)
            except re.error as e:
                raise MatchSpecError(f"bad regex {pattern!r}: {e}") from None
        return cls(kind, which, pattern)


def _number_value(token: str) -> Fraction:
    token = token.replace(",", "")
    if "/" in token:
        num, den = token.split("/", 1)
        return Fraction(num) / Fraction(den) if Fraction(den) else Fraction(num)
    return Fraction(token)


def extract_number(text: str, which: str = "last") -> Fraction | None:
    """The response's answer number: the one after the last answer mark if any, else the last (first) number."""
    marks = list(_ANSWER_MARK.finditer(text))
    if marks:
        m = _NUMBER.search(text, marks[-1].end())
        if m and m.start() - marks[-1].end() <= 3:
            return _number_value(m.group())
    found = _NUMBER.findall(text)
    if not found:
        return None
    return _number_value(found[-1] if which == "last" else found[0])


def extract_option(text: str) -> str | None:
    for pattern in _OPTION_PATTERNS:
        m = pattern.search(text)
        if m:
            return m.group(1).upper()
    return None


def extract_node_list(text: str) -> list[int]:
    marks = list(re.finditer(r"answer\s*:", text, re.IGNORECASE))
    tail = text[marks[-1].end():] if marks else text
    return [int(x) for x in _INTEGER.findall(tail)]


def _normalize(s: str) -> str:
    return " ".join(s.casefold().split())


def _text_value(s: str) -> str:
    return _normalize(s).strip(" .,;:!?\"'()[]")


def _regex_value(pattern: str, text: str, last: bool) -> str | None:
    matches = list(re.finditer(pattern, text))
    if not matches:
        return None
    m = matches[-1] if last else matches[0]
    return _normalize(m.group(1) if m.groups() else m.group())


def is_correct(response: str, answer: str, spec: MatchSpec) -> tuple[int, str | None, str | None]:
    """(1 if the response matches the answer else 0, what was read from the response, from the answer)."""
    if spec.kind == "number":
        got = extract_number(response, spec.which)
        want = extract_number(answer, "first")
        if want is None:  # a text answer
            return is_correct(response, answer, MatchSpec("text"))
        show = None if got is None else str(got)
        return int(got is not None and got == want), show, str(want)
    if spec.kind == "option":
        got, want = extract_option(response), extract_option(answer)
        if want is None:
            raise MatchSpecError(f"no option letter in the correct answer {answer!r}")
        return int(got == want), got, want
    if spec.kind == "node_list":
        got, want = extract_node_list(response), extract_node_list(answer)
        if not want:
            raise MatchSpecError(f"no node numbers in the correct answer {answer!r}")
        return int(got == want), ", ".join(map(str, got)), ", ".join(map(str, want))
    if spec.kind == "text":
        got, want = _text_value(response), _text_value(answer)
        return int(got == want), got, want
    if spec.kind == "regex":
        got = _regex_value(spec.pattern, response, last=True)
        want = _regex_value(spec.pattern, answer, last=False) or _normalize(answer)
        return int(got is not None and got == want), got, want
    raise MatchSpecError(f"match kind {spec.kind!r} has no answer to match (the item carries its label)")


def truth(item: dict, default: MatchSpec) -> int:
    """The audited correctness of one item: its human label for kind 'label', else the regex match."""
    spec = MatchSpec.parse(item["match"]) if "match" in item else default
    if spec.kind == "label":
        return int(item["label"])
    return is_correct(item["response"], item["answer"], spec)[0]


def disagreements(truths, labels) -> list[tuple[int, str]]:
    """(index, error kind) of every item whose evaluator label differs from the audited truth. A false positive
    labels a wrong response correct; a false negative labels a correct response wrong."""
    out = []
    for i, (t, lab) in enumerate(zip(truths, labels)):
        if int(t) != int(lab):
            out.append((i, "false_positive" if int(lab) == 1 else "false_negative"))
    return out
