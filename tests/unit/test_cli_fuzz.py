"""Every flag of every command, fed random values (negative, zero, huge, empty, wrong type, unknown choice,
or its default): `imagenet-train` either starts normally or exits 2 with one line on stderr, never a
traceback. Commands and flags are discovered from the real parser; `cli.dispatch` is replaced by a
recorder so a normal start does not run the command."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from imagenet_train import cli

pytestmark = pytest.mark.unit

NASTY = ["-1", "-3.5", "0", "0.0", "1e308", "99999999999999999999", "", "abc", "no-such-choice", "nan", "-inf"]


def commands() -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `imagenet-train`, by name, from the real parser."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


COMMANDS = commands()
# Options a command cannot start without, given first so that random later flags (argparse: last wins)
# are tried against an otherwise valid command line.
REQUIRED = {"train": ["--shards", "x"], "plan": ["--nshards", "4", "--samples-per-shard", "10"]}


def flag_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of a command (not --help)."""
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings and a.nargs != argparse.REMAINDER]


def takes_no_value(action: argparse.Action) -> bool:
    return action.nargs == 0


def values_for(action: argparse.Action) -> st.SearchStrategy[str]:
    """Random values for one flag: the nasty ones, random numbers, its default and (if any) its choices."""
    pool = list(NASTY)
    if action.default not in (None, argparse.SUPPRESS):
        pool.append(str(action.default))
    if action.choices:
        pool += [str(choice) for choice in action.choices]
    return st.one_of(
        st.sampled_from(pool),
        st.integers(-(10**30), 10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )


@st.composite
def command_lines(draw) -> list[str]:
    """`COMMAND [POSITIONAL...] [--flag=VALUE ...]` with random flags of that command."""
    name = draw(st.sampled_from(sorted(COMMANDS)))
    parser = COMMANDS[name]
    argv = [name, *REQUIRED.get(name, [])]
    for _ in positionals(parser):
        argv.append(draw(st.sampled_from(["x", "", "-1", "gs://b/p", "http://127.0.0.1:9/shards.json"])))
    options = flag_options(parser)  # a command may have none (the hidden ssh-node)
    chosen = st.lists(st.sampled_from(options), max_size=4, unique_by=lambda a: a.dest) if options else st.just([])
    for action in draw(chosen):
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if takes_no_value(action):
            # BooleanOptionalAction lists --x and --no-x; store_true only --x.
            argv.append(draw(st.sampled_from(action.option_strings)))
        else:
            argv.append(f"{flag}={draw(values_for(action))}")
    if name == "launch":
        argv += ["--", "train", "--shards", "x"]
    return argv


def test_every_command_and_flag_is_discovered():
    assert {"train", "shards", "plan", "launch", "serve", "probe"} <= set(COMMANDS)
    train_flags = {s for a in flag_options(COMMANDS["train"]) for s in a.option_strings}
    assert {"--lr", "--checkpoint-every", "--io-timeout", "--on-broken-shard"} <= train_flags


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=command_lines())
def test_random_flag_values_exit_2_with_one_line_or_start_normally(argv):
    started: list[argparse.Namespace] = []

    def record(args: argparse.Namespace) -> int:
        started.append(args)
        return 0

    stderr, stdout = io.StringIO(), io.StringIO()
    real = cli.dispatch
    cli.dispatch = record
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            try:
                code = cli.main(argv)
            except SystemExit as exit_:
                code = exit_.code
    finally:
        cli.dispatch = real
    text = stderr.getvalue()
    event(f"{argv[0]}: {'started' if started else f'exit {code}'}")
    if started:
        assert code == 0 and "Traceback" not in text, (argv, code, text)
    else:
        lines = text.splitlines()
        assert code == 2, f"{argv}: neither a start nor exit 2 (got {code!r}): {text[-2000:]}"
        assert len(lines) == 1 and lines[0].startswith("imagenet-train"), f"{argv}: stderr was {text!r}"


def test_negative_learning_rate_is_one_line_naming_the_flag():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(["train", "--shards", "x", "--lr", "-1"])
        except SystemExit as exit_:
            code = exit_.code
    lines = stderr.getvalue().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("imagenet-train: error: --lr: expected a number > 0") and "got '-1'" in lines[0]
