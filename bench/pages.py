"""Sections of a Markdown page by their `## ` headings (pure: no I/O), so a regenerated page keeps what a
person wrote into it."""

from __future__ import annotations

from collections.abc import Sequence


def sections(text: str) -> list[list[str]]:
    """The page's `## ` sections, each its lines from the heading to the line before the next one."""
    found: list[list[str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced:
            found.append([])
        if found:
            found[-1].append(line)
    return found


def hand_written(old: str, generated: Sequence[str]) -> list[str]:
    """The lines of `old`'s sections whose heading starts with none of `generated`, in their order, each
    ending in one blank line."""
    kept: list[str] = []
    for section in sections(old):
        if not section[0].startswith(tuple(generated)):
            while section and not section[-1].strip():
                section.pop()
            kept += [*section, ""]
    return kept


def replace_section(text: str, heading: str, lines: Sequence[str]) -> str:
    """`text` with its section under `heading` replaced by `lines` (appended when it has none); the rest kept."""
    kept: list[str] = []
    replaced = False
    head = text.split("\n## ", 1)[0].rstrip("\n").splitlines()
    for part in sections(text):
        if part[0] == heading:
            part, replaced = list(lines), True
        kept += part
    if not replaced:
        kept += ["", *lines]
    return "\n".join([*head, "", *kept]).rstrip("\n") + "\n"
