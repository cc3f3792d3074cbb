"""The launcher kinds are one table (launchers/kinds.py): `launch` recognises each environment as its entry's kind,
the chart's deployment takes its launcher.kind words and their rules from it, and a kind the chart cannot deploy is
refused in one line when deployment.yaml (or the chart's values) is read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

import imagenet_train
from imagenet_train.deployment import problems, read_deployment, rendezvous_env
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.kinds import KINDS, LauncherKind, chart_launchers, detected
from imagenet_train.launchers.launch import resolve

from conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE = Path(imagenet_train.__file__).resolve().parent
# One environment per kind `launch` recognises, as its launcher sets it.
ENVIRONMENTS = {
    LauncherKind.SSH: {
        "IMAGENET_TRAIN_NNODES": "2",
        "IMAGENET_TRAIN_NODE_RANK": "1",
        "IMAGENET_TRAIN_MASTER_ADDR": "h0",
    },
    LauncherKind.NGC: {"NGC_ARRAY_SIZE": "2", "NGC_ARRAY_INDEX": "1", "NGC_GPUS_PER_NODE": "8", "NGC_MASTER_ADDR": "m"},
    LauncherKind.TRAINJOB: {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "t-node-0-0.t"},
    LauncherKind.PYTORCHJOB: {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "MASTER_ADDR": "p-master-0"},
    LauncherKind.JOBSET: {
        "JOB_COMPLETION_INDEX": "1",
        "JOBSET_NAME": "j",
        "REPLICATED_JOB_NAME": "node",
        "NNODES": "2",
    },
    LauncherKind.INDEXEDJOB: {"JOB_COMPLETION_INDEX": "1", "NNODES": "2", "MASTER_ADDR": "i-0.i"},
    LauncherKind.SLURM: {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_GPUS_ON_NODE": "2"},
    LauncherKind.NODE_PER_REPLICA: {"MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "1"},
    LauncherKind.STANDALONE: {},
}


def chart_document(kind: str) -> dict:
    """deployment.yaml as the chart writes it from its default values, with launcher.kind set to `kind`."""
    values = yaml.safe_load((REPO / "helm" / "imagenet-train" / "values.yaml").read_text())
    document = {key: values[key] for key in ("launcher", "shards", "results", "cache", "gcp", "resources")}
    document |= {"name": "r-imagenet-train", "release": "r"}
    document["launcher"]["kind"] = kind
    return document


def test_every_kind_has_one_entry_and_every_entry_says_what_runs_it():
    assert set(KINDS) == set(LauncherKind)
    assert all(entry.runs for entry in KINDS.values())


def test_standalone_which_matches_any_environment_is_the_last_kind_launch_tries():
    assert [kind for kind, entry in KINDS.items() if entry.environment][-1] is LauncherKind.STANDALONE


@pytest.mark.parametrize("kind", list(ENVIRONMENTS), ids=str)
def test_launch_recognises_each_launchers_environment_as_its_kind(kind):
    assert detected(ENVIRONMENTS[kind])[0] is kind
    assert resolve(ENVIRONMENTS[kind], nproc="2").kind is kind


def test_the_kinds_started_by_their_own_command_are_never_taken_from_an_environment():
    assert {kind for kind, entry in KINDS.items() if entry.environment} == set(ENVIRONMENTS)
    every_variable = {name: "1" for env in ENVIRONMENTS.values() for name in env}
    assert detected(every_variable)[0] is LauncherKind.SSH  # the table's order decides, first match wins


def test_the_chart_offers_exactly_the_table_kinds_that_have_a_chart_entry():
    schema = yaml.safe_load((REPO / "helm" / "imagenet-train" / "values.schema.json").read_text())
    assert set(schema["properties"]["launcher"]["properties"]["kind"]["enum"]) == {str(k) for k in chart_launchers()}
    assert set(chart_launchers()) == {
        LauncherKind.PYTORCHJOB,
        LauncherKind.INDEXEDJOB,
        LauncherKind.TRAINJOB,
        LauncherKind.JOBSET,
    }


@pytest.mark.parametrize("kind", list(chart_launchers()), ids=str)
def test_the_deployment_gives_launch_a_rendezvous_only_where_no_operator_sets_one(kind):
    env = rendezvous_env(chart_document(str(kind)), "r-imagenet-train")
    master = chart_launchers()[kind].master
    assert env.get("MASTER_ADDR") == (master("r-imagenet-train") if master else None)
    assert read_deployment(chart_document(str(kind))).nproc >= 1


@pytest.mark.parametrize("word", ["slurm", "PyTorchJob", "kubeflow", "", None])
def test_a_kind_the_chart_cannot_deploy_is_refused_in_one_line_naming_the_field_and_the_kinds(word):
    with pytest.raises(ImagenetTrainError) as error:
        read_deployment(chart_document(word))
    message = str(error.value)
    assert message.startswith("launcher.kind: expected one of ") and "\n" not in message
    assert all(str(kind) in message for kind in chart_launchers()) and f"got '{word}'" in message
    assert problems(chart_document(word)) == [message]  # render.py and tools/ngc.py read the same one line


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal in a module (docstrings and f-string parts included), with its line."""
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)]


@pytest.mark.parametrize("module", ["deployment.py", "launchers/launch.py"])
def test_the_modules_that_read_the_table_spell_no_kind_as_a_string(module):
    words = {str(kind) for kind in LauncherKind}
    spelt = [f"{module}:{line}: {value!r}" for line, value in _string_constants(PACKAGE / module) if value in words]
    assert not spelt, "use the LauncherKind member:\n" + "\n".join(spelt)


def _kind_comparisons(path: Path) -> list[str]:
    """Each comparison in a module with a LauncherKind member on either side (alone or in a tuple, list or set)."""

    def names_a_kind(node: ast.expr) -> bool:
        parts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return any(isinstance(p, ast.Attribute) and getattr(p.value, "id", "") == "LauncherKind" for p in parts)

    tree = ast.parse(path.read_text())
    compares = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)]
    return [f"line {c.lineno}" for c in compares if any(map(names_a_kind, [c.left, *c.comparators]))]


def test_no_code_outside_the_table_branches_on_a_kind():
    branching = [
        f"{path.relative_to(PACKAGE)}: {where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "launchers" / "kinds.py"
        for where in _kind_comparisons(path)
    ]
    assert not branching, "put what differs by kind in launchers/kinds.py's KINDS:\n" + "\n".join(branching)


@pytest.mark.parametrize("kind", list(chart_launchers()), ids=str)
def test_only_the_trainjob_refuses_the_variables_its_operator_sets_in_the_charts_env(kind):
    document = chart_document(str(kind)) | {"env": [{"name": "PET_NNODES", "value": "2"}, {"name": "X", "value": "1"}]}
    refused = [message for message in problems(document) if message.startswith("env: ")]
    expected = [
        "env: the Trainer webhook refuses the TrainJob: spec.trainer.env must not have reserved envs, "
        "invalid envs configured: [PET_NNODES] (Kubeflow Trainer sets them)"
    ]
    assert refused == (expected if kind == LauncherKind.TRAINJOB else [])


def test_an_indexed_pod_without_master_addr_takes_pod_zero_from_its_jobset_or_is_refused_naming_its_kind():
    jobset = ENVIRONMENTS[LauncherKind.JOBSET]
    launched = resolve(jobset, None)
    assert launched.kind == LauncherKind.JOBSET and "--master_addr=j-node-0-0.j" in launched.torchrun
    unnamed = {k: v for k, v in jobset.items() if k != "REPLICATED_JOB_NAME"}
    with pytest.raises(ImagenetTrainError, match="^launch: jobset environment without MASTER_ADDR"):
        resolve(unnamed, None)
    indexed = {k: v for k, v in ENVIRONMENTS[LauncherKind.INDEXEDJOB].items() if k != "MASTER_ADDR"}
    with pytest.raises(ImagenetTrainError, match="^launch: indexedjob environment without MASTER_ADDR"):
        resolve(indexed, None)
