"""The words after `# @schema` in values.yaml: what one key takes, short enough to read beside its default.

    dns-label            a named kind of value (chartkit.formats); `dns-label?` also takes "" (or null)
    Always|Never         one of these strings
    1..1024   0..        a range (minimum..maximum)
    maxLength=40         any other JSON Schema keyword, its value read as YAML
    required             the mapping around the key cannot drop it (a values file's `key: null`)
    [SPEC]               a list of SPEC
    {a: SPEC, b: SPEC}   a mapping of exactly these keys (`, ...` allows others)

A key without a spec takes what its default is: true/false, a whole number, text (no control characters),
or, for a mapping, exactly the keys it has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from .formats import Format

TOKEN = re.compile(r"\s*([\[\]{},:]|[^\s\[\]{},:]+)")
WORDS = {
    "maxLength": "at most {} characters",
    "minLength": "at least {} characters",
    "minItems": "at least {} items",
    "minProperties": "at least {} keys",
    "maxProperties": "at most {} keys",
}
RANGE = re.compile(r"(-?[0-9.]+)?\.\.(-?[0-9.]+)?")


@dataclass
class Spec:
    """One parsed `@schema` text."""

    kind: str | None = None
    optional: bool = False
    enum: list[str] | None = None
    keywords: dict = field(default_factory=dict)
    required: bool = False
    items: Spec | None = None
    fields: dict[str, Spec] | None = None
    open: bool = False

    @property
    def empty(self) -> bool:
        """Whether the spec says nothing about the value's kind (the default's type decides)."""
        return self.kind is None and self.enum is None and self.items is None and self.fields is None


class _Tokens:
    def __init__(self, text: str):
        self.tokens, position = [], 0
        while text[position:].strip():
            match = TOKEN.match(text, position)
            if not match:  # pragma: no cover - TOKEN matches any non-blank text
                raise ValueError(f"cannot read {text[position:][:40]!r}")
            self.tokens.append(match.group(1))
            position = match.end()
        self.index = 0

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected and token != expected):
            raise ValueError(f"expected {expected or 'more'} after {' '.join(self.tokens[: self.index])[-40:]!r}")
        self.index += 1
        return token


def _number(text: str) -> int | float:
    return float(text) if "." in text else int(text)


def _word(spec: Spec, word: str) -> None:
    span = RANGE.fullmatch(word)
    if word == "required":
        spec.required = True
    elif span and word != "...":
        low, high = span.groups()
        if low is not None:
            spec.keywords["minimum"] = _number(low)
        if high is not None:
            spec.keywords["maximum"] = _number(high)
    elif "=" in word:
        name, _, value = word.partition("=")
        spec.keywords[name] = yaml.safe_load(value)
    elif "|" in word:
        spec.enum = word.split("|")
    elif re.fullmatch(r"[a-z][a-z0-9-]*\??", word):
        spec.kind, spec.optional = word.rstrip("?"), word.endswith("?")
    else:
        raise ValueError(f"cannot read {word[:40]!r}")


def _spec(tokens: _Tokens, stops: set) -> Spec:
    spec = Spec()
    while tokens.peek() not in stops:
        if tokens.peek() is None:
            raise ValueError(f"expected {' or '.join(sorted(stops))} at the end")
        token = tokens.take()
        if token == "[":
            spec.items = _spec(tokens, {"]"})
            tokens.take("]")
        elif token == "{":
            spec.fields, spec.open = {}, False
            while tokens.peek() != "}":
                name = tokens.take()
                if name == "...":
                    spec.open = True
                else:
                    tokens.take(":")
                    spec.fields[name] = _spec(tokens, {",", "}"})
                if tokens.peek() == ",":
                    tokens.take()
            tokens.take("}")
        elif token in "]},:":
            raise ValueError(f"unexpected {token!r}")
        else:
            _word(spec, token)
    return spec


def parse_spec(text: str) -> Spec:
    """A Spec from `@schema` text; raises ValueError saying what it could not read."""
    return _spec(_Tokens(text), {None})


def describe(spec: Spec, formats: Mapping[str, Format], inferred: str = "") -> str:
    """What the key takes, in words, for the docs table (`inferred`: the words for its default's type)."""
    if spec.items is not None:
        text = f"list of {describe(spec.items, formats)}"
    elif spec.fields is not None:
        text = "{" + ", ".join([*spec.fields, *(["..."] if spec.open else [])]) + "}"
    elif spec.enum is not None:
        text = ", ".join(f"`{value}`" for value in spec.enum)
    elif spec.kind is not None:
        kind = formats.get(spec.kind, Format({}, spec.kind))
        text = kind.doc + ((", or null" if kind.empty == "null" else ", or empty") if spec.optional else "")
    else:
        text = inferred
    low, high = spec.keywords.get("minimum"), spec.keywords.get("maximum")
    if low is not None and high is not None:
        text += f", {low} to {high}"
    elif low is not None:
        text += f", ≥ {low}"
    elif high is not None:
        text += f", ≤ {high}"
    for name, value in spec.keywords.items():
        if name not in ("minimum", "maximum"):
            text += f", {WORDS[name].format(value)}" if name in WORDS else f", {name} {value}"
    return text
