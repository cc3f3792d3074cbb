"""The CLI's commands by concern: their options, checks and hand-off to the modules that do the work.
Each module's `COMMANDS` declares its subcommands (options as a dataclass, see declarations.py); cli.py adds
them to `imagenet-train` with `add_command`; `Parser` gives them all the one-line error format."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from imagenet_train.declarations import add_flag, add_options, did_you_mean, option
from imagenet_train.errors import one_line
from imagenet_train.limits import ONE_SHOT_IO_TIMEOUT

_INVALID_CHOICE = re.compile(r"invalid choice: '(.*?)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line naming the flag, exit code 2, and the declared name
    closest to a misspelled flag or choice ("did you mean --batch-size?")."""

    def parse_args(self, args=None, namespace=None):
        """Parse all of `args`; a flag no parser declares is one error line with the closest declared flag."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            unknown = next((word.split("=", 1)[0] for word in extras if word.startswith("--")), "")
            hint = did_you_mean(unknown, self.flags_of(parsed)) if unknown else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def flags_of(self, parsed: argparse.Namespace) -> list[str]:
        """The flags this parser takes, with those of the subcommand `parsed` chose."""
        flags = [name for action in self._actions for name in action.option_strings]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
                flags += chosen.flags_of(parsed) if isinstance(chosen, Parser) else []
        return flags

    def error(self, message: str) -> NoReturn:
        """Exit with code 2 after one `imagenet-train: error:` line naming the flag."""
        message = message.removeprefix("argument ")
        if match := _INVALID_CHOICE.search(message):  # a misspelled command or word
            words = [word.strip(" '") for word in match.group(2).split(",")]
            message += did_you_mean(match.group(1), words, quoted=True)
        self.exit(2, f"imagenet-train: error: {one_line(message)}\n")


class _Version(argparse.Action):
    """--version, worked out only when asked (it runs git and reads torch's version)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from imagenet_train.version import version_line

        print(version_line(), flush=True)  # on stdout, as argparse's own version action and pip, git, kubectl
        parser.exit(0)


def add_version(parser: argparse.ArgumentParser) -> None:
    """`imagenet-train --version`: the package's version, its git revision and torch's version, then exit 0."""
    parser.add_argument("--version", action=_Version, help="show the version, git revision and torch's, then exit")


def deployment_file(path: str) -> dict:
    """The chart's deployment.yaml; its storage environment and writable paths are applied to this process."""
    from imagenet_train.deployment import POD_DEFAULTS, WRITABLE_ENV, chart_launcher, storage_env
    from imagenet_train.yaml_input import read_mapping

    document = read_mapping(path, "--deployment")
    if "launcher" in document:  # fill and probe read only the shard sections; launch needs the launcher's
        chart_launcher(document, f"--deployment {path}: launcher.kind")
    os.environ.update({**storage_env(document, document["name"]), **POD_DEFAULTS, **os.environ, **WRITABLE_ENV})
    return document


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and help, its options dataclass, and what runs it.

    settings: groups of training settings taken as `train` takes them, as (group title, setting names); their
    flags default to absent, so a flag given can be told from one a `--config` file gives."""

    name: str
    help: str
    options: type
    run: Callable[[argparse.Namespace], int]
    check: Callable[[argparse.Namespace], None] | None = None
    description: str | None = None
    settings: tuple[tuple[str, tuple[str, ...]], ...] = ()


def training(name: str, context: str = "", given_only: bool = True) -> Any:
    """A field of a command's options that is the training setting `name`'s flag, as `train` declares it.

    given_only: the flag defaults to absent so the command can tell it was given (see declarations.add_flag);
    `context` goes before its help ("with --simulate: ")."""
    from imagenet_train.config import declaration

    setting, rule = declaration(name)
    metadata = {"setting": rule, "given_only": given_only, "context": context}
    return dataclasses.field(default=setting.default, metadata=metadata)


def one_shot_io_timeout(default: float = ONE_SHOT_IO_TIMEOUT, waiting_for: str = "the shard server") -> Any:
    """--io-timeout as a one-shot command takes it: a short budget by default (train's rides out a pod's move)."""
    return option(
        default,
        f"seconds to wait out an outage of {waiting_for} before failing (capped exponential backoff); "
        "train's own default is 900 s, to ride out a server pod's rescheduling",
        kind=float,
        minimum=0,
        maximum=7 * 24 * 3600,
    )


def add_arguments(parser: argparse.ArgumentParser, command: Command) -> None:
    """A command's arguments, all generated: its options dataclass, then its groups of training settings."""
    from imagenet_train.config import declaration

    add_options(parser, command.options)
    for title, names in command.settings:
        group = parser.add_argument_group(title)
        for name in names:
            add_flag(group, *declaration(name))
    parser.set_defaults(func=command.run, **({"check": command.check} if command.check else {}))


def add_command(
    commands: argparse._SubParsersAction, command: Command, formatter: type[argparse.HelpFormatter]
) -> None:
    """Add `command` to the CLI's subcommands."""
    parser = commands.add_parser(
        command.name, formatter_class=formatter, help=command.help, description=command.description
    )
    add_arguments(parser, command)
