"""Closed sets are enums and every setting is declared once: read from the source with `ast`, and checked on the
parsers and dataclasses the declarations build."""

from __future__ import annotations

import ast
import dataclasses
import json
from enum import Enum

import pytest

from imagenet_train.choices import Amp, BrokenShardPolicy, Decoder, Mode, Opt
from imagenet_train.cli import build_parser
from imagenet_train.config import Config, defaults
from imagenet_train.config_files import settings_from
from imagenet_train.declarations import declared, flag
from imagenet_train.deployment import ShardServer
from imagenet_train.launchers.kinds import LauncherKind, chart_launchers
from imagenet_train.planning import plan

from conftest import REPO as ROOT

pytestmark = pytest.mark.unit

PACKAGE = ROOT / "app" / "imagenet_train"
CLOSED_SETS = {
    "--decoder": Decoder,
    "--amp": ("auto", "bf16", "fp16", "off"),
    "--on-broken-shard": BrokenShardPolicy,
    "--mode": Mode,
    "launcher.kind": LauncherKind,
    "shards.server": ShardServer,
}
WORDS = {str(word) for words in CLOSED_SETS.values() for word in words}


def word_comparisons(tree: ast.AST) -> list[ast.Compare]:
    """Comparisons (==, !=, in, not in) of anything with a closed set's word written as a string."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [
            item
            for operand in operands
            for item in (operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand])
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
        ]
        if any(literal.value in WORDS for literal in literals):
            found.append(node)
    return found


def test_no_module_compares_a_closed_set_as_strings():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        for node in word_comparisons(ast.parse(path.read_text(), str(path))):
            found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "compare with the enum's members (Decoder.DALI, Amp.OFF, ...):\n" + "\n".join(found)


def test_the_check_finds_a_string_comparison_of_a_closed_set():
    source = 'if data.decoder == "dali" or amp in ("bf16", "fp16") or kind != LauncherKind.JOBSET: pass'
    assert [ast.unparse(n) for n in word_comparisons(ast.parse(source))] == [
        "data.decoder == 'dali'",
        "amp in ('bf16', 'fp16')",
    ]


def test_the_enums_name_exactly_the_words_config_and_the_chart_accept():
    choices = {d.name: rule.choices for section in Config().sections() for d, rule in declared(section)}
    assert choices["decoder"] == tuple(d.value for d in Decoder)
    assert choices["on_broken_shard"] == tuple(p.value for p in BrokenShardPolicy)
    assert choices["mode"] == tuple(m.value for m in Mode)
    schema = json.loads((ROOT / "helm" / "imagenet-train" / "values.schema.json").read_text())["properties"]
    assert set(schema["launcher"]["properties"]["kind"]["enum"]) == {k.value for k in chart_launchers()}
    assert schema["shards"]["properties"]["server"]["enum"] == [s.value for s in ShardServer]


def test_a_config_holding_enum_members_saves_and_loads_back_as_the_words():
    cfg = Config()
    cfg.loader.decoder, cfg.loader.on_broken_shard, cfg.loader.mode = Decoder.FUSED, BrokenShardPolicy.FAIL, Mode.SPLIT
    saved = json.loads(cfg.to_json())
    assert (saved["loader"]["decoder"], saved["loader"]["on_broken_shard"], saved["loader"]["mode"]) == (
        "fused",
        "fail",
        "split",
    )
    loaded = settings_from(saved, "config.json")
    assert loaded["decoder"] is Decoder.FUSED  # the word, read back as its member


def test_every_closed_set_is_declared_as_its_enum_and_a_word_becomes_the_member():
    closed = [(d, rule) for section in Config().sections() for d, rule in declared(section) if rule.choices]
    assert [d.name for d, _ in closed if not isinstance(d.default, Enum)] == []
    assert all(d.type == type(d.default).__name__ for d, _ in closed)  # annotated with the enum, not str
    cfg = Config()
    cfg.loader.mode, cfg.optim.opt, cfg.run.amp = "split", "lars", "bf16"  # as code or an old caller gives them
    cfg.validate()
    assert (cfg.loader.mode, cfg.optim.opt, cfg.run.amp) == (Mode.SPLIT, Opt.LARS, Amp.BF16)
    assert type(cfg.loader.mode) is Mode and type(cfg.optim.opt) is Opt and type(cfg.run.amp) is Amp


# Flags other commands share with `train` in the same meaning. (`shards --workers` or `--seed` are the
# converter's own: a different setting under the same word.)
SHARED_WITH_TRAIN = {"--trust-index", "--verify-shards"}


def flags_declared_by_commands() -> list[str]:
    """Flags of declared settings a command adds with add_argument itself: any in plan, the shared ones anywhere."""
    found = []
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        settings = {flag(name) for name in defaults()} if path.name == "plan_cmd.py" else SHARED_WITH_TRAIN
        tree = ast.parse(path.read_text())
        found += [
            f"{path.name}:{node.lineno}: {node.args[0].value}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in settings
        ]
    return found


def test_no_command_declares_a_flag_of_a_training_setting_itself():
    found = flags_declared_by_commands()
    assert not found, "take them from config.py's declarations (add_flag):\n" + "\n".join(found)


def test_plan_flags_default_and_check_as_train_declares_them():
    args = build_parser().parse_args(["plan", "--nshards", "1", "--samples-per-shard", "1"])
    args.check(args)  # settings not given come from --config FILE, else their declared defaults
    # --io-timeout is plan's own, a one-shot command's short budget (tests/unit/test_one_shot_budgets.py)
    taken = {name: value for name, value in vars(args).items() if name in defaults() and name != "io_timeout"}
    assert set(taken) >= {"workers", "batch_size", "mode", "epoch_batches", "repeat", "seed", "verify_shards"}
    assert taken == {name: defaults()[name] for name in taken}


def test_the_planners_setup_defaults_are_the_declared_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(plan.Setup)}
    shared = {"workers", "batch_size", "mode", "epoch_batches", "repeat", "seed"}
    assert {name: fields[name] for name in shared} == {name: defaults()[name] for name in shared}


def test_plan_takes_a_recipes_settings_from_config_and_gives_each_rank_its_share(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("global_batch_size: 1024\nworkers: 12\nmode: split\n")
    argv = ["plan", "--config", str(recipe), "--nshards", "64", "--samples-per-shard", "100", "--gpus-per-node", "8"]
    args = build_parser().parse_args(argv)
    args.check(args)
    assert (args.batch_size, args.workers, args.mode) == (128, 12, "split")
    given = build_parser().parse_args([*argv, "--workers", "3"])
    given.check(given)
    assert given.workers == 3  # a flag given wins over the file
