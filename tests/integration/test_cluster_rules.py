"""What only a real API server sees, brought to the tests: every vendored CRD's CEL rules and the operators'
admission webhooks (tests/k8s_rules), run on every render of the chart's values matrix, on `helm upgrade`
pairs of renders, on manifests/examples and on hand-made objects that must be refused."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from chart_matrix import MATRIX, RELEASE, render_py, render_values
from k8s_rules import admission, cel, jobset, trainer, training_operator

from conftest import REPO as ROOT

EXAMPLES = ROOT / "manifests" / "examples"
NAME = f"{RELEASE}-imagenet-train"
WORKLOAD = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob", "jobset": "JobSet"}
# The refusal, word for word, from a real kube-apiserver v1.36 with Trainer v2.3 installed.
REFUSED_MANAGER = (
    'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.runtimePatches.manager: '
    'Invalid value: "imagenet-train": must be a domain-prefixed path (such as "acme.io/foo")'
)


def custom_resources() -> list[dict]:
    """The distinct custom resources of the whole matrix (render.py renders; test_chart shows helm's equal)."""
    seen, out = set(), []
    for entry in MATRIX:
        for obj in render_py(entry).values():
            text = json.dumps(obj, sort_keys=True)
            if obj["kind"] in cel.CRD_FILES and text not in seen:
                seen.add(text)
                out.append(obj)
    return out


def harness_runtime() -> dict:
    """The torch-distributed ClusterTrainingRuntime the TrainJobs refer to (as the e2e harness plays it)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": trainer.TORCH_DISTRIBUTED,
    }


def reachable(obj: dict, path: str) -> bool:
    """Whether a schema location (`a.b[].c`, `m{}`) holds a value in the object."""
    values = [obj]
    for part in filter(None, re.split(r"\.|(\[\]|\{\})", path)):
        if part == "[]":
            values = [item for v in values if isinstance(v, list) for item in v]
        elif part == "{}":
            values = [item for v in values if isinstance(v, dict) for item in v.values()]
        else:
            values = [v[part] for v in values if isinstance(v, dict) and part in v]
    return bool(values)


def test_every_cel_rule_of_the_vendored_crds_parses():
    failures = [f for kind in cel.CRD_FILES for f in cel.check_parses(kind)]
    assert not failures, "\n".join(failures)
    counts = {kind: len(cel.rules(kind)) for kind in cel.CRD_FILES}
    assert counts == {
        "PyTorchJob": 1,
        "TrainJob": 19,
        "TrainingRuntime": 11,
        "ClusterTrainingRuntime": 11,
        "JobSet": 8,
        "AIStore": 5,
        "PodMonitor": 0,  # prometheus-operator v0.93.0's CRD carries no CEL rule: its schema is the whole check
    }


def test_cel_rules_call_only_functions_the_evaluator_knows():
    called = Counter()
    for kind in cel.CRD_FILES:
        for rule in cel.rules(kind):
            called.update(re.findall(r"([A-Za-z_]\w*)\s*\(", re.sub(r"'[^']*'", "''", rule.rule)))
    assert set(called) <= cel.FUNCTIONS, (
        f"rules call functions the evaluator does not have: {set(called) - cel.FUNCTIONS}"
    )
    print(f"functions and macros the vendored rules call: {dict(called)}")


def test_every_rendered_custom_resource_is_admitted_by_cel_rules_and_webhooks():
    ran: Counter = Counter()
    problems = []
    objects = [*custom_resources(), harness_runtime()]
    for obj in objects:
        # Created, then `helm upgrade` with the same values: the transition rules run against the stored object.
        for old in (None, obj):
            result = admission.admit(obj, old)
            problems += [f"{obj['kind']}/{obj['metadata']['name']}: {p}" for p in result.problems]
            ran.update(result.ran)
    assert not problems, "\n".join(problems[:20])
    per_kind = Counter(kind for kind, _, _ in ran)
    evaluations = Counter()
    for (kind, _, _), times in ran.items():
        evaluations[kind] += times
    # PodMonitors have no CEL rule or webhook to run here; test_chart checks them against their CRD's schema.
    kinds = {"PyTorchJob", "TrainJob", "JobSet", "AIStore", "ClusterTrainingRuntime", "PodMonitor"}
    assert {o["kind"] for o in objects} == kinds
    # A rule that did not run sits under a field no stored object has (no silent skip).
    stored = [admission.admit(o).obj for o in objects]
    for kind in {o["kind"] for o in objects}:
        for rule in cel.rules(kind):
            if (kind, rule.path, rule.rule) not in ran:
                reached = [o["metadata"]["name"] for o in stored if o["kind"] == kind and reachable(o, rule.path)]
                assert not reached, f"{kind} {rule.path}: {rule.rule!r} never ran, yet {reached[0]} has the field"
    # PyTorchJob's one rule sits under runPolicy.schedulingPolicy, which the chart does not render.
    assert set(per_kind) == {"TrainJob", "JobSet", "AIStore", "ClusterTrainingRuntime"}
    print(
        f"{len(objects)} distinct custom resources, created and upgraded unchanged; CEL rules that ran per CRD: "
        + ", ".join(
            f"{k} {per_kind[k]} of {len(cel.rules(k))} rules ({evaluations[k]} evaluations)" for k in sorted(per_kind)
        )
    )


def test_the_rendered_trainjob_passes_the_trainer_webhook():
    for entry in [e for e in MATRIX if e[0] == "trainjob"]:
        job = render_py(entry)[("TrainJob", NAME)]
        managers = [p["manager"] for p in job["spec"]["runtimePatches"]]
        assert admission.admit(job).problems == [], managers
        assert trainer.trainjob_problems(job) == []


def test_the_trainer_webhook_refuses_a_manager_without_a_domain_in_the_api_servers_words():
    job = copy.deepcopy(render_py(("trainjob", "nginx", 2, False))[("TrainJob", NAME)])
    job["spec"]["runtimePatches"][0]["manager"] = "imagenet-train"
    assert admission.admit(job).problems == [REFUSED_MANAGER]


# `helm upgrade` of a running release: the same values, changed train values, more nodes, a new elastic range,
# the image pinned by digest.
UPGRADES = {
    "unchanged": ({}, {}),
    "train values": ({"train": {"lr": 0.4}}, {"train": {"lr": 0.2}}),
    "nodes": ({"launcher": {"nodes": 2}}, {"launcher": {"nodes": 4}}),
    "elastic range": (
        {"launcher": {"nodes": 2, "elastic": {"enabled": True, "minNodes": 1, "maxNodes": 2}}},
        {"launcher": {"nodes": 2, "elastic": {"enabled": True, "minNodes": 2, "maxNodes": 4}}},
    ),
    "image pinned by digest": (
        {"image": {"tag": "v0.1.0"}},
        {"image": {"tag": "v0.1.0", "digest": "sha256:" + "4f0c" * 16}},
    ),
}
# What the API server answers. Changed train values reach the pods through the ConfigMap only, and so does an
# elastic range (PET_NNODES comes from deployment.yaml), so each workload is unchanged and admitted; more nodes
# change a JobSet's replicatedJobs and a TrainJob's spec.trainer, both immutable (NOTES.txt: "helm upgrade
# cannot change a running jobset/trainjob's pods"). A PyTorchJob may change: its operator scales it. Pinning the
# image by digest changes the pods' image: the same refusals (a pinned image is for a new release of those two).
EXPECTED_UPGRADE = {
    ("pytorchjob", "unchanged"): [],
    ("pytorchjob", "train values"): [],
    ("pytorchjob", "nodes"): [],
    ("pytorchjob", "elastic range"): [],
    ("jobset", "unchanged"): [],
    ("jobset", "train values"): [],
    ("jobset", "nodes"): [
        'admission webhook "vjobset.kb.io"',
        'spec.replicatedJobs: Invalid value: "array": field is immutable',
    ],
    ("jobset", "elastic range"): [],
    ("trainjob", "unchanged"): [],
    ("trainjob", "train values"): [],
    ("trainjob", "nodes"): [
        "TrainJob.trainer.kubeflow.org",
        'spec.trainer: Invalid value: "object": field is immutable',
    ],
    ("pytorchjob", "image pinned by digest"): [],
    ("jobset", "image pinned by digest"): [
        'admission webhook "vjobset.kb.io"',
        'spec.replicatedJobs: Invalid value: "array": field is immutable',
    ],
    ("trainjob", "image pinned by digest"): [
        "TrainJob.trainer.kubeflow.org",
        'spec.trainer: Invalid value: "object": field is immutable',
    ],
}


@pytest.mark.parametrize(
    "launcher,change", sorted(EXPECTED_UPGRADE), ids=[f"{a}-{b}" for a, b in sorted(EXPECTED_UPGRADE)]
)
def test_helm_upgrade_meets_the_transition_rules_and_update_webhooks(launcher, change):
    before, after = UPGRADES[change]
    kind = WORKLOAD[launcher]
    old = render_values({**before, "launcher": {**before.get("launcher", {}), "kind": launcher}})[(kind, NAME)]
    new = render_values({**after, "launcher": {**after.get("launcher", {}), "kind": launcher}})[(kind, NAME)]
    result = admission.admit(new, old)
    expected = EXPECTED_UPGRADE[(launcher, change)]
    if not expected:
        assert result.problems == []
    else:
        assert len(result.problems) == 1 and all(part in result.problems[0] for part in expected), result.problems
    transitions = sum(times for (_, path, rule), times in result.ran.items() if "oldSelf" in rule)
    print(f"{kind} {change}: {transitions} transition-rule evaluations, {len(result.problems)} refusals")
    if kind != "PyTorchJob":  # a PyTorchJob's one transition rule sits under schedulingPolicy, not rendered
        assert transitions > 0


# One hand-made object per CRD that breaks one of its rules, and the rule's message.
BROKEN = [
    ("TrainJob", lambda o: o["metadata"].update(name="9-lives"), None, "metadata.name must match RFC 1035 DNS label"),
    (
        "JobSet",
        lambda o: o["spec"].update(
            startupPolicy={"startupPolicyOrder": "InOrder"},
            replicatedJobs=[
                *o["spec"]["replicatedJobs"],
                {**o["spec"]["replicatedJobs"][0], "name": "b", "dependsOn": [{"name": "node", "status": "Ready"}]},
            ],
        ),
        None,
        "StartupPolicy and DependsOn APIs are mutually exclusive",
    ),
    (
        "PyTorchJob",
        lambda o: o["spec"]["runPolicy"].update(schedulingPolicy={"queue": "b"}),
        lambda o: o["spec"]["runPolicy"].update(schedulingPolicy={"queue": "a"}),
        "spec.runPolicy.schedulingPolicy.queue is immutable",
    ),
    (
        "AIStore",
        lambda o: o["spec"]["stateStorage"].update(emptyDir={}),
        None,
        "exactly one of hostPath, pvc, or emptyDir must be set",
    ),
    (
        "ClusterTrainingRuntime",
        lambda o: o["spec"]["mlPolicy"].update(mpi={}),
        None,
        "Only one of the policy can be configured",
    ),
    (
        "TrainingRuntime",
        lambda o: o["spec"]["mlPolicy"].update(torch={"envInjection": {"targets": [{"containerNames": ["node"]}]}}),
        None,
        "containerNames must not include the main node container",
    ),
]


@pytest.mark.parametrize("kind,breaks,before,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_crd_has_a_rule_the_evaluator_refuses_with_its_message(kind, breaks, before, message):
    if kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        base = {**copy.deepcopy(harness_runtime()), "kind": kind}
    else:
        base = next(copy.deepcopy(o) for o in custom_resources() if o["kind"] == kind)
    assert cel.evaluate(base).problems == []
    broken, old = copy.deepcopy(base), None
    breaks(broken)
    if before is not None:
        old = copy.deepcopy(base)
        before(old)
    problems = cel.evaluate(broken, old).problems
    assert len(problems) == 1 and message in problems[0], problems
    assert any(message in p for p in admission.admit(broken, old).problems)


def test_optional_old_self_and_message_expression_behave_as_in_kubernetes():
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"replicas": {"type": "integer", "default": 1}},
                "x-kubernetes-validations": [
                    {
                        "rule": "!oldSelf.hasValue() || self.replicas >= oldSelf.value().replicas",
                        "optionalOldSelf": True,
                        "messageExpression": "'replicas may only grow, not to ' + string(self.replicas)",
                    },
                    {"rule": "self.replicas <= 8", "message": "at most 8", "fieldPath": ".replicas"},
                ],
            }
        },
    }
    rules = cel.RuleSet("Test", schema)
    created = cel.evaluate({"kind": "Test", "spec": {}}, None, rules)
    assert created.problems == [] and sum(created.ran.values()) == 2  # optionalOldSelf runs on create too
    shrunk = cel.evaluate({"kind": "Test", "spec": {"replicas": 2}}, {"kind": "Test", "spec": {"replicas": 3}}, rules)
    assert shrunk.problems == ['spec: Invalid value: "object": replicas may only grow, not to 2']
    too_many = cel.evaluate({"kind": "Test", "spec": {"replicas": 9}}, None, rules)
    assert too_many.problems == ['spec.replicas: Invalid value: "object": at most 8']


def test_a_rule_the_evaluator_cannot_parse_fails_by_name():
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.(", "message": "m"}]}
    with pytest.raises(cel.CelRuleError, match=r"cannot parse CEL 'self\.\('"):
        cel.evaluate({"kind": "Broken"}, None, cel.RuleSet("Broken", schema))


def test_the_examples_are_admitted():
    examples = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.endswith(".values.yaml"))
    kinds, problems = set(), []
    for path in examples:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj["kind"] in cel.CRD_FILES:
                kinds.add(obj["kind"])
                problems += [f"{path.name}: {p}" for p in admission.admit(obj).problems]
    assert not problems, "\n".join(problems)
    assert {"PyTorchJob", "TrainJob", "JobSet", "AIStore"} <= kinds


def test_the_jobset_webhook_defaults_before_it_validates():
    rendered = render_py(("jobset", "nginx", 2, False))[("JobSet", NAME)]
    stored = admission.admit(rendered).obj["spec"]
    assert stored["successPolicy"] == {"operator": "All"}
    assert stored["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert stored["replicatedJobs"][0]["groupName"] == "default"  # the CRD's own default
    assert stored["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}


def test_the_jobset_webhook_refuses_names_whose_pods_pass_63_characters():
    rendered = render_py(("jobset", "nginx", 4, False))[("JobSet", NAME)]
    long = copy.deepcopy(rendered)
    long["metadata"]["name"] = "a" * 50
    refused = jobset.create_problems(admission.mutate(long))
    assert refused == [f'spec.replicatedJobs[0].name: Invalid value: "{"a" * 50}-node-0": {jobset.POD_NAME_TOO_LONG}']


def test_the_pytorchjob_webhook_refuses_what_v1_9_refuses():
    job = copy.deepcopy(render_py(("pytorchjob", "nginx", 2, False))[("PyTorchJob", NAME)])
    assert training_operator.pytorchjob_problems(job) == []
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    assert training_operator.pytorchjob_problems(job) == [
        "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1",
        "spec.pytorchReplicaSpecs[Worker].template.spec.containers: Required value: must have at least one "
        "container with name pytorch",
    ]


def test_render_py_refuses_a_trainjob_env_the_trainer_reserves(tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"launcher": {"kind": "trainjob"}, "env": [{"name": "PET_NNODES", "value": "3"}]}))
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "must not have reserved envs, invalid envs configured: [PET_NNODES]" in result.stderr
