"""values.yaml read as the chart's one annotated source: each key's default, its `# --` description
(helm-docs' convention), its `# @schema` line (what it takes) and the `# @rule` lines (if/then across keys).

    # -- Nodes (pods) in the job.              the description: this line and the plain lines after it
    # @schema 1..1024 required                 what the key takes (chartkit.specs)
    # @schema.claims array                     a key the defaults leave out, and what it takes
    nodes: 2

    # @rule trainjob has no elastic policy     a rule over keys of the mapping it sits in (a comment block
    #   if launcher.kind = trainjob            above a key: that key's mapping; a free block: the mapping
    #   then launcher.elastic.enabled = false  around it, the whole file at the top)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from imagenet_train.errors import ImagenetTrainError

KEY = re.compile(r"^( *)([A-Za-z0-9_./-]+):(?:\s|$)")
COMMENT = re.compile(r"^( *)#(.*)$")

Path_ = tuple[str, ...]


@dataclass
class Annotation:
    """What the comment block right above one key says about it."""

    line: int
    description: str = ""
    spec: str = ""
    extras: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    """An if/then rule over the keys below `scope`; `message` becomes its $comment."""

    scope: Path_
    message: str
    clause: str
    line: int


@dataclass
class Source:
    """values.yaml: its defaults, each annotated key (by path) and its rules."""

    path: Path
    defaults: dict
    annotations: dict[Path_, Annotation]
    lines: dict[Path_, int]
    rules: list[Rule]

    def where(self, line: int) -> str:
        """`values.yaml:LINE` for messages."""
        return f"{self.path.name}:{line}"


def _value_at(data: dict, path: Path_) -> object:
    node: object = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _block(source: Source, comments: list[tuple[int, int, str]], scope: Path_, key_line: int | None) -> Annotation:
    """One comment block: the key's annotation (key_line None: a free block, rules only); rules go to `source`."""
    annotation = Annotation(key_line or 0)
    description: list[str] = []
    rules: list[tuple[int, str, list[str]]] = []
    describing = in_rule = False
    for number, _indent, text in comments:
        body = text.strip()
        if in_rule and text.startswith("   ") and not body.startswith("@"):
            rules[-1][2].append(body)  # an indented line continues the rule's if/then
            continue
        in_rule = False
        if body.startswith("@"):
            describing = False
            word, _, rest = body.partition(" ")
            if key_line is None and word != "@rule":
                raise ImagenetTrainError(f"{source.where(number)}: {word} must sit right above its key")
            if word == "@schema":
                annotation.spec = f"{annotation.spec} {rest}".strip()
            elif word.startswith("@schema."):
                annotation.extras[word.removeprefix("@schema.")] = rest
            elif word == "@rule":
                rules.append((number, rest.strip(), []))
                in_rule = True
            else:
                raise ImagenetTrainError(f"{source.where(number)}: unknown annotation {word[:40]!r}")
        elif text.startswith(" --"):
            description, describing = [text[3:].strip()], True
        elif describing:
            description.append(body)
    annotation.description = " ".join(part for part in description if part)
    source.rules += [Rule(scope, message, " ".join(clause), number) for number, message, clause in rules]
    return annotation


def read_source(path: Path) -> Source:
    """values.yaml's defaults, annotations and rules; raises ImagenetTrainError naming the line of a bad one."""
    text = path.read_text()
    defaults = yaml.safe_load(text) or {}
    source = Source(path, defaults, {}, {}, [])
    stack: list[tuple[int, str]] = []
    comments: list[tuple[int, int, str]] = []

    def enclosing(indent: int) -> Path_:
        return tuple(key for level, key in stack if level < indent)

    for number, line in enumerate(text.splitlines(), start=1):
        comment, key = COMMENT.match(line), KEY.match(line)
        if comment:
            comments.append((number, len(comment.group(1)), comment.group(2)))
        elif not line.strip():
            if comments:
                _block(source, comments, enclosing(comments[0][1]), None)
            comments = []
        elif key:
            indent, name = len(key.group(1)), key.group(2)
            parent = enclosing(indent)
            container = _value_at(defaults, parent) if parent else defaults
            if not isinstance(container, dict) or name not in container:
                comments = []  # a line inside a value (a block list, a multi-line string): not a key
                continue
            stack = [(level, k) for level, k in stack if level < indent] + [(indent, name)]
            key_path = (*parent, name)
            source.lines[key_path] = number
            if comments:
                source.annotations[key_path] = _block(source, comments, key_path, number)
            comments = []
        else:
            comments = []
    if comments:
        _block(source, comments, (), None)
    return source
