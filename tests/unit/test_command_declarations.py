"""Every command's options are declared once, as a dataclass (declarations.option/positional, commands.training):
its parser, its one-line errors and its table in docs/commands.md come from that declaration."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import io
from dataclasses import dataclass
from enum import Enum

import pytest

from imagenet_train import cli
from imagenet_train.commands import Parser
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.images import ImageCheck
from imagenet_train.declarations import add_options, option, positional
from imagenet_train.errors import ImagenetTrainError

from conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "app" / "imagenet_train"
# The two modules that build parsers from declarations; every other module declares.
BUILDERS = {PACKAGE / "declarations.py", PACKAGE / "commands" / "__init__.py"}
BY_HAND = {"add_argument", "add_parser", "add_argument_group", "add_mutually_exclusive_group"}


def test_no_command_writes_argparse_by_hand():
    found = []
    for path in sorted({*PACKAGE.rglob("*.py")} - BUILDERS):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BY_HAND:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.func.attr}")
    assert not found, "declare these as option()/positional() fields of the command's options:\n" + "\n".join(found)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """The real parser's subcommands, by name."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_of_every_command_is_a_declared_field_and_has_a_row_in_the_docs():
    page = (REPO / "docs" / "commands.md").read_text()
    parsers = subcommands()
    assert sorted(parsers) == sorted(command.name for command in cli.COMMANDS)
    for command in cli.COMMANDS:
        section = page.split(f"\n## {command.name}\n", 1)[1].split("\n## ", 1)[0]
        fields = {f.name for f in dataclasses.fields(command.options)}
        grouped = {name for _, names in command.settings for name in names}
        for action in parsers[command.name]._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.dest in fields | grouped, f"{command.name}: {action.dest} is not declared"
            if action.dest in fields:
                shown = action.option_strings[0] if action.option_strings else None
                assert shown is None or f"`{shown}`" in section, f"{command.name}: no row for {shown}"
            else:
                assert f"`{action.option_strings[0]}`" in section or "every setting of the" in section


def run(argv: list[str]) -> tuple[int, str]:
    """`imagenet-train ARGV...` in this process: its exit code and stderr (the command itself is not run)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as leave:
            code = leave.code
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["shards", "a", "b", "--maxcount", "0"], "--maxcount: expected a whole number >= 1 and <= 10000000, got '0'"),
        (["shards", "a", "b", "--verify=all"], "--verify: expected one of full, header, got 'all'"),
        (["shards", "", "b"], "source: expected a non-empty value, got ''"),
        (["serve", "d", "--port", "65536"], "--port: expected a whole number >= 0 and <= 65535, got '65536'"),
        (["probe", "x", "--wait", "nan"], "--wait: expected a number >= 0 and <= 604800, got 'nan'"),
        (["fashion-mnist", "o", "--val-from", "train"], "--val-from: expected one of holdout, test, got 'train'"),
        (["slurm", "--signal", "KILL"], "--signal: expected [R:]SIG[@SECONDS] such as USR1@120, got 'KILL'"),
        (["fill"], "the following arguments are required: --deployment"),
        (["ray", "--workers", "-1"], "--workers: expected a whole number >= 0 and <= 100000, got '-1'"),
        (["plan", "--nodes", "0"], "--nodes: expected a whole number >= 1 and <= 100000, got '0'"),
    ],
)
def test_a_bad_value_of_a_declared_option_exits_2_with_one_line_naming_it(argv, message):
    code, err = run(argv)
    assert code == 2
    assert err == f"imagenet-train: error: {message}\n"


def test_the_converter_refuses_an_image_check_word_that_the_shards_command_does_not_offer(tmp_path):
    with pytest.raises(ImagenetTrainError) as refused:
        convert(str(tmp_path), str(tmp_path / "out"), ShardOptions(verify="sometimes"))
    words = ", ".join(check.value for check in ImageCheck)
    assert str(refused.value) == f"--verify: expected one of {words}, got 'sometimes'"
    assert words == "full, header"


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Example:
    """A command with one argument of each kind the declarations build."""

    target: str = positional("where")
    colour: str = option(Colour.RED.value, "which colour", choices=Colour)
    count: int = option(2, "how many", minimum=1, maximum=9)
    limit: float | None = option(None, "seconds", kind=float, above=0)
    tag: list[str] = option([], "a tag", many=True, metavar="TAG")
    loud: bool = option(False, "a switch")
    keep: bool = option(True, "on unless --no-keep", negatable=True)
    rest: list[str] = positional("the rest", rest=True, nonempty=False)


def example_parser() -> Parser:
    parser = Parser(prog="example")
    add_options(parser, Example)
    return parser


def test_a_declared_dataclass_parses_into_its_fields_with_their_defaults():
    # As for launch: the options first, then the positional, then the rest of the line as it is.
    args = example_parser().parse_args(["--tag", "a", "--tag=b", "--no-keep", "here", "--", "train", "--x"])
    assert vars(args) == {
        "target": "here",
        "colour": "red",
        "count": 2,
        "limit": None,
        "tag": ["a", "b"],
        "loud": False,
        "keep": False,
        "rest": ["train", "--x"],
    }
    given = example_parser().parse_args(["--colour", "blue", "--count", "9", "--limit", "0.5", "--loud", "t"])
    assert (given.colour, given.count, given.limit, given.loud, given.keep) == ("blue", 9, 0.5, True, True)
    assert example_parser().parse_args(["t"]).tag == []  # each parse gets its own list


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--count", "10", "t"], "--count: expected a whole number >= 1 and <= 9, got '10'"),
        (["--limit", "0", "t"], "--limit: expected a number > 0, got '0'"),
        (["--colour", "green", "t"], "--colour: expected one of red, blue, got 'green'"),
        ([""], "target: expected a non-empty value, got ''"),
    ],
)
def test_a_declared_dataclass_refuses_bad_values_with_the_shared_message(argv, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as leave:
        example_parser().parse_args(argv)
    assert leave.value.code == 2
    assert err.getvalue() == f"imagenet-train: error: {message}\n"


def test_a_stale_commands_page_is_reported_and_regenerated_with_every_command(tmp_path, monkeypatch):
    from chartkit import schema

    page = tmp_path / "commands.md"
    current = schema.COMMANDS_PAGE.read_text()
    page.write_text("\n".join(line for line in current.splitlines() if "`--maxcount`" not in line) + "\n")
    monkeypatch.setattr(schema, "COMMANDS_PAGE", page)
    assert (tmp_path / "commands.md", current) in schema.generated()
    assert page.read_text() != current
