"""One declaration per setting: its help, its range or choices, and the check every entry point shares.

A dataclass field declared with `setting(...)` becomes a command-line flag (cli.py), is range-checked
with the same one-line message wherever a value comes from (flags, a config file, code), and documents
itself. A command's own options (not training settings) are declared the same way with `option(...)` and
`positional(...)` in a dataclass per command; `add_options` builds that command's parser from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Protocol

from imagenet_train.errors import ImagenetTrainError, clip


class Trust(str, Enum):
    """Which values of a setting run a command or widen what is trusted. Such a value is taken only from the
    command line, never from a file (a `--config` YAML, a run's config.json, a recipe): a file is data."""

    WHEN_ON = "true"  # a switch that widens trust when on (--trust-index)
    WHEN_OFF = "false"  # a check of untrusted input that is dropped when off (--no-verify-shards)
    PIPE = "pipe:"  # a URL or URL spec naming `pipe:` anywhere (in braces or a :: list; any case) runs the shell


@dataclass(frozen=True)
class Setting:
    """What a setting means and which values it takes."""

    help: str
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    maximum: float | None = None  # inclusive
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # older names still taken, as flags and config keys
    trust: Trust | None = None  # the values taken from the command line only (None: any value may come from a file)

    def widens(self, value: Any) -> bool:
        """Whether `value` runs a command or widens trust, so that only the command line may give it."""
        if self.trust is Trust.WHEN_ON:
            return value is True
        if self.trust is Trust.WHEN_OFF:
            return value is False
        if self.trust is Trust.PIPE:
            return isinstance(value, str) and Trust.PIPE.value in value.casefold()
        return False


def setting(default: Any, help: str, **rules: Any) -> Any:
    """A dataclass field carrying its Setting (help, minimum/above/maximum, choices: words or a str Enum,
    aliases: older names that flags and config files still take, trust: which values only a flag may give)."""
    choices = rules.get("choices")
    if isinstance(choices, type) and issubclass(choices, Enum):
        rules["choices"] = tuple(member.value for member in choices)
    return field(default=default, metadata={"setting": Setting(help, **rules)})


class Dataclass(Protocol):
    """A dataclass or its instance, as `dataclasses.fields` takes it (typeshed's DataclassInstance)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


def declared(instance_or_class: Dataclass | type[Dataclass]) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of a config dataclass that are settings, in declaration order."""
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(instance_or_class) if "setting" in f.metadata]


def flag(name: str) -> str:
    """The command-line flag of a setting: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def did_you_mean(given: str, known: Iterable[str], quoted: bool = False) -> str:
    """'; did you mean --batch-size?' for the known name closest to a misspelled one ('' when none is close)."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean '{close[0]}'?" if quoted else f"; did you mean {close[0]}?"


def sections_with(whole: Dataclass, values: Mapping[str, Any]) -> dict[str, Any]:
    """Each section of `whole` (a dataclass of setting sections), copied with the `values` it declares, by field
    name; a name that no section declares is refused in one line."""
    sections = {f.name: getattr(whole, f.name) for f in dataclasses.fields(whole)}
    owner = {d.name: key for key, section in sections.items() for d, _ in declared(section)}
    unknown = next((name for name in values if name not in owner), None)
    if unknown is not None:
        raise ImagenetTrainError(
            f"setting '{clip(unknown)}': no section declares it; expected a `train` option name with underscores"
            + did_you_mean(unknown, owner, quoted=True)
        )
    return {
        key: dataclasses.replace(section, **{n: v for n, v in values.items() if owner[n] == key})
        for key, section in sections.items()
    }


def canonical_names(sections: tuple[type, ...]) -> dict[str, str]:
    """Every alias of a declared setting, mapped to the setting's own name."""
    return {alias: d.name for section in sections for d, rule in declared(section) for alias in rule.aliases}


def expectation(kind: type, rule: Setting) -> str:
    """'a whole number >= 1', 'a number > 0', 'one of a, b' — what a value must be."""
    if rule.choices:
        return "one of " + ", ".join(rule.choices)
    noun = "a whole number" if kind is int else "a number"
    bounds = []
    if rule.above is not None:
        bounds.append(f"> {_plain(rule.above)}")
    if rule.minimum is not None:
        bounds.append(f">= {_plain(rule.minimum)}")
    if rule.maximum is not None:
        bounds.append(f"<= {_plain(rule.maximum)}")
    return noun + (" " + " and ".join(bounds) if bounds else "")


def _plain(bound: float) -> str:
    """1048576, not 1.04858e+06; 0.08 stays 0.08."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def problem(kind: type, rule: Setting, value: Any) -> str | None:
    """Why `value` is not acceptable for this setting, or None when it is."""
    if rule.choices:
        return None if value in rule.choices else expectation(kind, rule)
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return expectation(kind, rule)
        if kind is int and not float(value).is_integer():
            return expectation(kind, rule)
        too_low = (rule.minimum is not None and value < rule.minimum) or (
            rule.above is not None and value <= rule.above
        )
        too_high = rule.maximum is not None and value > rule.maximum
        return expectation(kind, rule) if too_low or too_high else None
    if kind is bool and not isinstance(value, bool):
        return "true or false"
    if kind is str and not isinstance(value, str):
        return "text"
    return None


def check(name: str, kind: type, rule: Setting, value: Any) -> None:
    """Raise the one-line error for a bad value of a setting."""
    wanted = problem(kind, rule, value)
    if wanted:
        raise ImagenetTrainError(f"{flag(name)}: expected {wanted}, got '{clip(value)}'")


def _parse(kind: type, text: str) -> Any:
    if kind is int:
        return int(text.strip())
    if kind is float:
        return float(text.strip())
    if issubclass(kind, Enum):
        return kind(text)  # a closed set's word: its member (ValueError: not one of them)
    return text


def member(kind: type, value: Any) -> Any:
    """A closed set's word as its enum member (a checked value of any other setting as it is)."""
    return kind(value) if issubclass(kind, Enum) else value


def converter(name: str, kind: type, rule: Setting) -> Callable[[str], Any]:
    """An argparse `type=` that parses and checks, failing with the setting's own message."""

    def convert(text: str) -> Any:
        try:
            value = _parse(kind, text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expectation(kind, rule)}, got '{clip(text)}'") from None
        wanted = problem(kind, rule, value)
        if wanted:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got '{clip(text)}'")
        return value

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def number(kind: type = int, minimum: float | None = None, maximum: float | None = None, above: float | None = None):
    """argparse `type=` for a plain command option: a checked int or float."""
    return converter("value", kind, Setting("", minimum=minimum, above=above, maximum=maximum))


def choice(*choices: str):
    """argparse `type=` for one of a closed set of words, with the shared message."""
    return converter("value", str, Setting("", choices=choices))


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    declaration: dataclasses.Field,
    rule: Setting,
    given_only: bool = True,
    context: str = "",
) -> None:
    """The flag of a declared setting: its type, range, choices and help all come from the declaration.

    given_only: the flag defaults to absent (SUPPRESS), so `train` can tell a flag given, which overrides
    `--config`, from the declared default; otherwise the flag defaults to the declared default (`plan`).
    `context` goes before the help: when the flag matters to this command ("with --simulate: ").
    """
    default = declaration.default
    help_text = context + rule.help + (f" ({expectation(type(default), rule)})" if rule.choices else "")
    help_text += f" (default: {default})" if given_only else " (default: %(default)s)"
    options: dict[str, Any] = {
        "dest": declaration.name,
        "default": argparse.SUPPRESS if given_only else default,
        "help": help_text,
    }
    names = [flag(name) for name in (declaration.name, *rule.aliases)]
    if isinstance(default, bool):
        parser.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
    else:
        kind = type(default)
        parser.add_argument(
            *names,
            type=converter(declaration.name, kind, rule),
            metavar=declaration.name.upper(),
            **options,
        )


@dataclass(frozen=True)
class Option:
    """How a command's own option (not a training setting) is given: its flag or place, type, bounds and help."""

    help: str
    flags: tuple[str, ...] = ()  # default: the field's name as a flag (--dry-run)
    positional: bool = False
    kind: type | None = None  # when the default does not say (None): int, float, str, bool
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    maximum: float | None = None  # inclusive
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    required: bool = False
    nonempty: bool = False  # text that must not be empty
    many: bool = False  # repeatable, each use appended to a list
    negatable: bool = False  # --x and --no-x (a bool default False is otherwise a plain --x switch)
    optional: bool = False  # a positional that may be left out (its default then)
    rest: bool = False  # a positional taking the rest of the command line
    parse: Callable[[str], Any] | None = None  # an argparse `type=` of its own (a format no rule describes)

    def value_kind(self, default: Any) -> type:
        """The type of the option's value: declared, else the default's, else text."""
        return self.kind or (str if default is None or isinstance(default, list) else type(default))


def option(default: Any, help: str, **rules: Any) -> Any:
    """A dataclass field that is a command's flag (rules: see Option; choices: a str Enum or words)."""
    choices = rules.get("choices")
    if isinstance(choices, type) and issubclass(choices, Enum):
        rules["choices"] = tuple(member.value for member in choices)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"option": Option(help, **rules)})
    return field(default=default, metadata={"option": Option(help, **rules)})


def positional(help: str, default: Any = None, **rules: Any) -> Any:
    """A dataclass field that is a command's positional argument (text that must not be empty unless `nonempty`)."""
    return option(default, help, **{"positional": True, "nonempty": True, **rules})


def field_default(declaration: dataclasses.Field) -> Any:
    """A field's default, from its default_factory when it has one."""
    if declaration.default_factory is not dataclasses.MISSING:
        return declaration.default_factory()
    return declaration.default


def _option_type(kind: type, rule: Option) -> Callable[[str], Any] | None:
    """The argparse `type=` that parses and checks an option's value with the shared one-line messages."""
    if rule.parse:
        return rule.parse
    if rule.choices:
        return choice(*rule.choices)
    if kind in (int, float):
        return number(kind, rule.minimum, rule.maximum, rule.above)
    return text if rule.nonempty else None


def add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, declaration: dataclasses.Field) -> None:
    """The argument of a declared command option: its flag, action, type, bounds and help from the declaration."""
    rule: Option = declaration.metadata["option"]
    default = field_default(declaration)
    kind = rule.value_kind(default)
    options: dict[str, Any] = {"help": rule.help}
    if rule.positional:
        names = [declaration.name]
        if rule.rest:
            options["nargs"] = argparse.REMAINDER
        elif rule.optional:
            options.update(nargs="?", default=default)
    else:
        names = list(rule.flags or (flag(declaration.name),))
        options.update(dest=declaration.name, default=default)
        if rule.required:
            options["required"] = True
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction if rule.negatable else "store_true"
    else:
        if rule.many:
            options["action"] = "append"
        convert = _option_type(kind, rule)
        if convert:
            options["type"] = convert
    if rule.metavar:
        options["metavar"] = rule.metavar
    parser.add_argument(*names, **options)


def add_options(parser: argparse.ArgumentParser, options_class: type) -> None:
    """Every argument of a command, in declaration order, from its options dataclass.

    A field declared with `option`/`positional` is the command's own; one carrying a training Setting is that
    setting's flag as `train` declares it (metadata `given_only`, `context`: see add_flag)."""
    for declaration in dataclasses.fields(options_class):
        if "option" in declaration.metadata:
            add_option(parser, declaration)
        else:
            metadata = declaration.metadata
            add_flag(parser, declaration, metadata["setting"], metadata["given_only"], metadata["context"])


def json_schema(sections: tuple[type, ...], exclude: frozenset[str] = frozenset()) -> dict:
    """JSON Schema (draft 7) of a flat settings mapping, one property per declared setting."""
    properties = {}
    for section in sections:
        for declaration, rule in declared(section):
            if declaration.name not in exclude:
                properties[declaration.name] = _property(type(declaration.default), rule, declaration.default)
                for alias in rule.aliases:  # older names, so existing values files keep working
                    old = _property(type(declaration.default), rule, declaration.default)
                    old["description"] = f"older name of {declaration.name}: {rule.help}"
                    properties[alias] = old
    return {"type": "object", "additionalProperties": False, "properties": properties}


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _property(kind: type, rule: Setting, default: Any) -> dict:
    json_type = next(name for base, name in _JSON_TYPES.items() if issubclass(kind, base))  # a str Enum: string
    schema: dict[str, Any] = {"description": rule.help, "type": json_type, "default": default}
    if rule.choices:
        schema["enum"] = list(rule.choices)
    for key, bound in (("minimum", rule.minimum), ("exclusiveMinimum", rule.above), ("maximum", rule.maximum)):
        if bound is not None:
            schema[key] = kind(bound)
    return schema


def text(text_value: str) -> str:
    """argparse `type=` for free text that must not be empty."""
    if not text_value.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value, got ''")
    return text_value
