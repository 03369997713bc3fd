"""How the evaluator is asked, and how an ICL example is written (the paper's Fig. 2): the user turn restates the
response and the expected answer, the assistant turn gives the correct label. A query is written with the same user
turn, so every example in memory is one past query of the evaluator with its right answer.

A template is a built-in name ("answer", "summary") or a YAML file (`icqs schema allure-template`), e.g.

    system: "You grade answers. Reply 'label: 1' if the response's final answer equals the expected answer, else
      'label: 0'."
    user: "Question: {question}\nResponse: {response}\nExpected answer: {answer}"
    match: text

with the keys
  system        the instruction (system message)
  user          the user turn, a format string over the item's fields ({response}, {answer}, {question}, ...)
  label_prefix  what the assistant writes before the label digit (default "label:")
  icl_max_words optional {field: n}: in ICL examples only, that field is cut to its first n words (long sources)
  match         the default match spec for items without their own "match" (see icqs.allure.audit)
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import UserError
from icqs.io import read_yaml

from ..contracts import check_yaml
from .audit import MatchSpec, MatchSpecError

LABELS = (0, 1)

BUILTIN = {
    "answer": dict(
        system=(
            "You grade answers. The user gives a response to a task and the task's expected answer. Reply "
            "'label: 1' if the response's final answer equals the expected answer and 'label: 0' if it "
            "does not."
        ),
        user="Response: {response}\nExpected answer: {answer}",
        match="number",
    ),
    "summary": dict(
        system=(
            "Evaluation criteria: consistency (0 or 1), the factual alignment between the summary and the "
            "source text. A factually consistent summary contains only statements that are entailed by the "
            "source text. Read the source text, then the summary, and check whether the summary contains "
            "any fact not supported by the source. Reply 'label: 1' if the summary is factually consistent "
            "and 'label: 0' if it is not."
        ),
        user="Source text: {source}\nSummary: {response}",
        icl_max_words={"source": 120},
        match="label",
    ),
}


MAX_FORMAT_WIDTH = 1000  # characters: the widest padding or precision a 'user' field may ask for


@dataclass
class Template:
    name: str
    system: str
    user: str
    label_prefix: str = "label:"
    icl_max_words: dict = field(default_factory=dict)
    match: MatchSpec = field(default_factory=lambda: MatchSpec("number"))

    @property
    def fields(self) -> list[str]:
        return [name for _, name, _, _ in string.Formatter().parse(self.user) if name]

    @property
    def options(self) -> list[str]:
        """The label continuations scored after the prompt (which ends with the label prefix)."""
        return [f" {label}" for label in LABELS]

    def user_turn(self, item: dict, max_words: dict | None = None) -> str:
        values = {}
        for name in self.fields:
            if name not in item:
                raise UserError(f"item {item.get('id', '?')!r} lacks field {name!r} used by template {self.name!r}")
            text = str(item[name])
            limit = (max_words or {}).get(name)
            if limit and len(text.split()) > limit:
                text = " ".join(text.split()[:limit]) + " ..."
            values[name] = text
        return self.user.format(**values)

    def assistant_turn(self, label: int) -> str:
        return f"{self.label_prefix} {int(label)}"

    def icl_example(self, item: dict, correct_label: int) -> tuple[str, str]:
        """(user text, assistant text) of the ICL example that corrects the evaluator on this item."""
        return self.user_turn(item, self.icl_max_words), self.assistant_turn(correct_label)

    def messages(self, examples: list[tuple[str, str]], item: dict) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}]
        for user, assistant in examples:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        msgs.append({"role": "user", "content": self.user_turn(item)})
        return msgs

    def prompt(self, tokenizer, examples: list[tuple[str, str]], item: dict) -> str:
        """The chat prompt, ending where the assistant writes the label digit."""
        return (
            tokenizer.apply_chat_template(self.messages(examples, item), add_generation_prompt=True) + self.label_prefix
        )

    def to_dict(self) -> dict:
        m = {"kind": self.match.kind, "which": self.match.which}
        if self.match.pattern:
            m["pattern"] = self.match.pattern
        return dict(
            name=self.name,
            system=self.system,
            user=self.user,
            label_prefix=self.label_prefix,
            icl_max_words=dict(self.icl_max_words),
            match=m,
        )


def load_template(spec: str) -> Template:
    """A built-in template by name, or one read from a YAML file."""
    if spec in BUILTIN:
        return template_from_dict(dict(BUILTIN[spec], name=spec), spec)
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"no such template file (built-in templates: {', '.join(BUILTIN)})", spec)
    node, d = read_yaml(spec, "a template file")  # bounded: size, aliases expanded, depth
    if not isinstance(d, dict):
        raise UserError("a template file must be a YAML mapping (`icqs schema allure-template`)", spec)
    check_yaml("allure-template", d, node, spec)
    return template_from_dict({"name": path.stem, **d}, spec)


def template_from_dict(d: dict, where: str = "template") -> Template:
    """A template from its keys (a YAML file's, or Template.to_dict()'s as kept in a run's settings)."""
    unknown = set(d) - {"name", "system", "user", "label_prefix", "icl_max_words", "match"}
    if unknown:
        raise UserError(f"unknown template key(s): {', '.join(sorted(unknown))}", where)
    for key in ("system", "user"):
        if not isinstance(d.get(key), str) or not d[key].strip():
            raise UserError(f"template needs a non-empty string {key!r}", where)
    try:
        match = MatchSpec.parse(d.get("match", "number"))
    except MatchSpecError as e:
        raise UserError(str(e), where) from None
    t = Template(
        name=str(d.get("name", where)),
        system=d["system"],
        user=d["user"],
        label_prefix=str(d.get("label_prefix", "label:")),
        icl_max_words=dict(d.get("icl_max_words") or {}),
        match=match,
    )
    try:
        specs = [spec for _, name, spec, _ in string.Formatter().parse(t.user) if name]  # "{response" fails here
    except ValueError as e:
        raise UserError(f"bad 'user' format string: {e}", where) from None
    for spec in specs:  # "{response:>999999999}" would pad every prompt to a gigabyte
        if "{" in spec or any(int(n) > MAX_FORMAT_WIDTH for n in re.findall(r"\d+", spec)):
            raise UserError(
                f"bad 'user' format string: the format spec {spec!r} has a width or precision over "
                f"{MAX_FORMAT_WIDTH} (or a nested field)",
                where,
            )
    return t
