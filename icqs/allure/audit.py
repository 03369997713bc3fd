"""The audit: is a response correct? Decided by matching it against the task's correct answer (a rule per match kind,
RULES below, also stated by `icqs schema allure`), then compared with the evaluator's label to find its errors (the
paper's Fig. 2, left half).

A match spec is a kind name or a dict with a "kind" and its options:
  exact      the response, or its final answer (after the last "answer is" / "answer:", up to the end of that
             sentence or line), equals the answer after normalizing (case-folding, collapsing whitespace, dropping
             punctuation and quotes at either end): "I think the answer is Paris." ~ "Paris", "Paris." ~ "paris",
             but "Paris, France" !~ "Paris"
  contains   the answer occurs in the response as whole words, after normalizing both ("It is Paris, I think." ~
             "Paris"); it cannot tell "Paris" from "not Paris": use it where responses state one answer
  number     the response's final number equals the answer's first number ("9 apples" ~ "... so 9 in all.");
             {"which": "last"|"first"}; a number after "answer is"/"answer:" wins over the last number; an answer
             that holds no number ("Paris") is matched by the exact rule
  option     the option letter ("(B)", "B)", "Answer: B", a leading "B") equals the answer's letter
  node_list  the integer sequence after the last "Answer:" (or in the whole text) equals the answer's sequence:
             "1, Left, 2" ~ "1, 2" and "Room 1, Room 3" ~ "1, 3" (the paper's cognitive-map answers)
  regex      {"pattern": ...}: the last match in the response (group 1 if any) equals the first match in the
             answer (or the whole answer), after case-folding and collapsing whitespace
  label      no matching: the item carries its human label (field "label", 1 correct / 0 incorrect)
  text       the earlier name of exact (task files that say `match: text` keep working, by the exact rule)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from engine.errors import did_you_mean
from icqs.contracts import unknown_key

KINDS = ("exact", "contains", "number", "option", "node_list", "regex", "label", "text")
ALIASES = {"text": "exact"}  # earlier names, matched by the rule they now stand for

# The rule of each kind, as the run prints it beside its counts (and the schema of `icqs schema allure` states it).
RULES = {
    "exact": "the response, or its final answer (after the last 'answer is' / 'answer:', to the end of that sentence "
    "or line), equals the answer after case-folding, collapsing whitespace and trimming punctuation",
    "contains": "the answer occurs in the response as whole words, after case-folding and collapsing whitespace",
    "number": "the response's final number (the one after 'answer is' / 'answer:', else the last; {'which': "
    "'first'}: the first) equals the answer's first number; an answer without a number is matched exact",
    "option": "the response's option letter ('(B)', 'B)', 'Answer: B', a leading 'B') equals the answer's letter",
    "node_list": "the integers after the response's last 'Answer:' (else all of its integers) equal the answer's",
    "regex": "the pattern's last match in the response (group 1 if any) equals its first match in the answer (else "
    "the whole answer), after case-folding and collapsing whitespace",
    "label": "no matching: the item's own label (1 right, 0 wrong)",
}

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
            raise MatchSpecError(
                f"unknown match kind {kind!r}{did_you_mean(kind, KINDS)} (known: {', '.join(KINDS)}; "
                f"`icqs schema allure` states each rule)"
            )
        unknown = sorted(set(spec) - {"kind", "which", "pattern"})
        if unknown:
            raise MatchSpecError(unknown_key(unknown[0], ("kind", "which", "pattern"), " in the match spec", "option"))
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
    tail = text[marks[-1].end() :] if marks else text
    return [int(x) for x in _INTEGER.findall(tail)]


def _normalize(s: str) -> str:
    return " ".join(s.casefold().split())


_TRIM = " .,;:!?\"'()[]*`\u201c\u201d\u2018\u2019"  # punctuation, quotes and markdown emphasis at either end
_TEXT_MARK = re.compile(r"answer\s*(?:is|:|=)\s*:?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")


def _text_value(s: str) -> str:
    return _normalize(s).strip(_TRIM)


def final_answers(response: str) -> list[str]:
    """What the exact rule compares, normalized: the whole response, then (when it has an answer mark) the text after
    the last mark to the end of its line, and to the end of its first sentence."""
    reads = [_text_value(response)]
    marks = list(_TEXT_MARK.finditer(response))
    if marks:
        tail = response[marks[-1].end() :].lstrip()
        line = tail.split("\n", 1)[0]
        end = _SENTENCE_END.search(tail)
        reads += [_text_value(line), _text_value(tail[: end.start()] if end else tail)]
    return reads


def _contains(response: str, answer: str) -> bool:
    """The normalized answer in the normalized response, not inside a longer word ("cat" is not in "category")."""
    want = _text_value(answer)
    if not want:
        return False
    left = r"(?<!\w)" if want[0].isalnum() or want[0] == "_" else ""
    right = r"(?!\w)" if want[-1].isalnum() or want[-1] == "_" else ""
    return re.search(left + re.escape(want) + right, _normalize(response)) is not None


def _regex_value(pattern: str, text: str, last: bool) -> str | None:
    matches = list(re.finditer(pattern, text))
    if not matches:
        return None
    m = matches[-1] if last else matches[0]
    return _normalize(m.group(1) if m.groups() else m.group())


class Match(NamedTuple):
    right: int  # 1 if the response matches the answer, else 0
    read: str | None  # what the rule read from the response (None: nothing it could read)
    expected: str | None  # what it read from the answer
    kind: str  # the rule applied: the spec's kind, "exact" for "text" and for a number spec on a text answer


def is_correct(response: str, answer: str, spec: MatchSpec) -> Match:
    """Whether the response matches the answer under the spec's rule, and what the rule read from each."""
    kind = ALIASES.get(spec.kind, spec.kind)
    if kind == "number":
        got = extract_number(response, spec.which)
        want = extract_number(answer, "first")
        if want is None:  # a text answer
            return is_correct(response, answer, MatchSpec("exact"))
        show = None if got is None else str(got)
        return Match(int(got is not None and got == want), show, str(want), kind)
    if kind == "option":
        got, want = extract_option(response), extract_option(answer)
        if want is None:
            raise MatchSpecError(f"no option letter in the correct answer {answer!r}")
        return Match(int(got == want), got, want, kind)
    if kind == "node_list":
        got, want = extract_node_list(response), extract_node_list(answer)
        if not want:
            raise MatchSpecError(f"no node numbers in the correct answer {answer!r}")
        return Match(int(got == want), ", ".join(map(str, got)), ", ".join(map(str, want)), kind)
    if kind == "exact":
        reads, want = final_answers(response), _text_value(answer)
        return Match(int(want in reads), want if want in reads else reads[-1], want, kind)
    if kind == "contains":
        found = _contains(response, answer)
        return Match(int(found), _text_value(answer) if found else None, _text_value(answer), kind)
    if kind == "regex":
        got = _regex_value(spec.pattern, response, last=True)
        want = _regex_value(spec.pattern, answer, last=False) or _normalize(answer)
        return Match(int(got is not None and got == want), got, want, kind)
    raise MatchSpecError(f"match kind {spec.kind!r} has no answer to match (the item carries its label)")


def spec_of(item: dict, default: MatchSpec) -> MatchSpec:
    return MatchSpec.parse(item["match"]) if "match" in item else default


def truth(item: dict, default: MatchSpec) -> int:
    """The audited correctness of one item: its human label for kind 'label', else the regex match."""
    return judge_item(item, default).right


def judge_item(item: dict, default: MatchSpec) -> Match:
    """The item's Match: its human label for kind 'label', else its response matched against its answer."""
    spec = spec_of(item, default)
    if spec.kind == "label":
        return Match(int(item["label"]), None, None, "label")
    return is_correct(item["response"], item["answer"], spec)


def disagreements(truths, labels) -> list[tuple[int, str]]:
    """(index, error kind) of every item whose evaluator label differs from the audited truth. A false positive
    labels a wrong response correct; a false negative labels a correct response wrong."""
    out = []
    for i, (t, lab) in enumerate(zip(truths, labels)):
        if int(t) != int(lab):
            out.append((i, "false_positive" if int(lab) == 1 else "false_negative"))
    return out
