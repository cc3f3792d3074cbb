"""JobSet v0.12's admission webhook (defaulting and validating), ported.

Source: https://github.com/kubernetes-sigs/jobset/blob/v0.12.0/pkg/webhooks/jobset_webhook.go:
`jobSetWebhook.Default`, `ValidateCreate` (with `validateFailurePolicy`, `validateCoordinator`,
`validateCoordinatorLabelValue`, `validateVolumeClaimPolicies` less its lookup of an existing PVC) and
`ValidateUpdate`; names from pkg/util/placement/placement.go (`GenJobName`, `GenPodName`) and
pkg/controllers (`CoordinatorEndpoint`, `GeneratePVCName`). Feature gates at their v0.12 defaults
(pkg/features/features.go): InPlaceRestart, RestartJob and ElasticJobSet off.
"""

from __future__ import annotations

import copy
import re

from .fields import dns1035_label, dns1123_subdomain, domain_prefixed_path, invalid, label_value

MAX_INT32 = 2**31 - 1
JOB_NAME_TOO_LONG = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
POD_NAME_TOO_LONG = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
GROUP_NAME_TOO_LONG = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters"
SUBDOMAIN_TOO_LONG = ".spec.network.subdomain is too long, must be less than 63 characters"
FAILURE_REASONS = [
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
]
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def default(jobset: dict) -> dict:
    """Default: what the webhook fills in before any validation sees the JobSet."""
    jobset = copy.deepcopy(jobset)
    spec = jobset.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for job in spec.get("replicatedJobs") or []:
        job_spec = job.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod.get("restartPolicy"):
            pod["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"
    for policy in spec.get("volumeClaimPolicies") or []:
        policy.setdefault("retentionPolicy", {"whenDeleted": "Delete"})
    return jobset


def _long(messages: list[str], replacement: str) -> list[str]:
    return [replacement if "must be no more than 63 characters" in m else m for m in messages]


def _job_problems(name: str, i: int, job: dict, seen: set[str]) -> list[str]:
    problems, path, spec = [], f"spec.replicatedJobs[{i}]", (job.get("template") or {}).get("spec") or {}
    replicas = int(job.get("replicas", 1))
    if int(spec.get("parallelism", 1)) * replicas > MAX_INT32:
        problems.append(
            f"the product of replicas and parallelism must not exceed {MAX_INT32} for replicatedJob '{job['name']}'"
        )
    for message in _long(dns1035_label(job.get("groupName", "")), GROUP_NAME_TOO_LONG):
        problems.append(invalid(f"{path}.groupName", job.get("groupName", ""), message))
    longest_job = f"{name}-{job['name']}-{replicas - 1}"
    for message in _long(dns1035_label(longest_job), JOB_NAME_TOO_LONG):
        problems.append(invalid(f"{path}.name", longest_job, message))
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is not None:
        longest_pod = f"{name}-{job['name']}-{replicas - 1}-{int(spec['completions']) - 1}-abcde"
        for message in _long(dns1035_label(longest_pod), POD_NAME_TOO_LONG):
            problems.append(invalid(f"{path}.name", longest_job, message))
    for depends in job.get("dependsOn") or []:
        if depends.get("name") not in seen:
            problems.append(f"replicatedJob: {job['name']} cannot depend on replicatedJob: {depends.get('name')}")
    return problems


def _failure_policy_problems(spec: dict, names: set[str]) -> list[str]:
    policy, problems = spec.get("failurePolicy"), []
    if policy is None:
        return problems
    rules = policy.get("rules") or []
    if any(r.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts") for r in rules):
        return [
            "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when "
            "RestartJob feature gate is disabled"
        ]
    by_name: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        rule_name = rule.get("name", "")
        if not 1 <= len(rule_name) <= 128:
            problems.append(
                f"invalid failure policy rule name of length {len(rule_name)}, the rule name must be at least 1 "
                "characters long and at most 128 characters long"
            )
        by_name.setdefault(rule_name, []).append(index)
        if not RULE_NAME.match(rule_name):
            problems.append(
                f"invalid failure policy rule name '{rule_name}', a failure policy rule name must start with an "
                "alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and "
                "must end with an alphanumeric character or '_'"
            )
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                problems.append(
                    f"invalid replicatedJob name '{target}' in failure policy does not appear in .spec.ReplicatedJobs"
                )
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in FAILURE_REASONS:
                problems.append(
                    f"invalid job failure reason '{reason}' in failure policy is not a recognized job failure reason"
                )
    for rule_name, indices in by_name.items():
        if len(indices) > 1:
            problems.append(
                f"rule names are not unique, rules with indices {indices} all have the same name '{rule_name}'"
            )
    return problems


def _coordinator_problems(jobset: dict) -> list[str]:
    spec, name = jobset["spec"], jobset["metadata"]["name"]
    coordinator, problems = spec["coordinator"], []
    job = next((j for j in spec.get("replicatedJobs") or [] if j["name"] == coordinator.get("replicatedJob")), None)
    job_index, pod_index = int(coordinator.get("jobIndex", 0)), int(coordinator.get("podIndex", 0))
    if job is None:
        problems.append(f"coordinator replicatedJob {coordinator.get('replicatedJob')} does not exist")
    else:
        job_spec = (job.get("template") or {}).get("spec") or {}
        if not 0 <= job_index < int(job.get("replicas", 1)):
            problems.append(f"coordinator job index {job_index} is invalid for replicatedJob {job['name']}")
        elif job_spec.get("completionMode") != "Indexed" or job_spec.get("completions") is None:
            problems.append(
                "job for coordinator pod must be indexed completion mode, and completions number must be set"
            )
        elif not 0 <= pod_index < int(job_spec["completions"]):
            problems.append(
                f"coordinator pod index {pod_index} is invalid for replicatedJob {job['name']} job index {job_index}"
            )
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    endpoint = f"{name}-{coordinator.get('replicatedJob')}-{job_index}-{pod_index}.{subdomain}"
    errors = label_value(endpoint)
    if errors:
        problems.append(
            f'spec will lead to invalid label value "{endpoint}" for coordinator label '
            '"jobset.sigs.k8s.io/coordinator" '
            f"(long JobSet / ReplicatedJob / SubDomain name?): {', '.join(errors)}"
        )
    return problems


def _volume_claim_problems(jobset: dict) -> list[str]:
    spec, name, problems, claims = jobset["spec"], jobset["metadata"]["name"], [], set()
    for p, policy in enumerate(spec.get("volumeClaimPolicies") or []):
        for t, template in enumerate(policy.get("templates") or []):
            path, claim = f"spec.volumeClaimPolicies[{p}].template[{t}].name", template["metadata"]["name"]
            if claim in claims:
                problems.append(invalid(path, claim, "names must be unique for VolumeClaimPolicies template"))
            problems += [invalid(path, claim, m) for m in dns1123_subdomain(claim)]
            if len(f"{claim}-{name}") > 63:
                problems.append(invalid(path, claim, "VolumeClaimPolicies template name is too long"))
            mounted = False
            for j, job in enumerate(spec.get("replicatedJobs") or []):
                pod = ((job.get("template") or {}).get("spec") or {}).get("template", {}).get("spec", {})
                for v, volume in enumerate(pod.get("volumes") or []):
                    if volume["name"] == claim:
                        where = f"spec.replicatedJobs[{j}].template.spec.template.spec.volumes[{v}].name"
                        problems.append(
                            invalid(
                                where, claim, f"volume name conflicts with VolumeClaimPolicy template name: {claim}"
                            )
                        )
                containers = (pod.get("initContainers") or []) + (pod.get("containers") or [])
                mounted = mounted or any(m["name"] == claim for c in containers for m in c.get("volumeMounts") or [])
            if not mounted:
                problems.append(
                    invalid(
                        "spec.replicatedJobs",
                        "array",
                        f"replicatedJob containers don't have a matching volumeMount: {claim} from VolumeClaimPolicies",
                    )
                )
            claims.add(claim)
    return problems


def create_problems(jobset: dict) -> list[str]:
    """ValidateCreate on the defaulted JobSet."""
    spec, name, problems = jobset["spec"], jobset["metadata"]["name"], []
    failure = spec.get("failurePolicy") or {}
    if failure.get("restartStrategy") == "InPlaceRestart":
        problems.append("InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled")
    jobs = spec.get("replicatedJobs") or []
    if jobs and jobs[0].get("dependsOn") is not None:
        problems.append("DependsOn can't be set for the first ReplicatedJob")
    subdomain = (spec.get("network") or {}).get("subdomain") or ""
    if subdomain:
        problems += [invalid("spec.network.subdomain", subdomain, m) for m in dns1123_subdomain(subdomain)]
        problems += [
            invalid("spec.network.subdomain", subdomain, m) for m in _long(dns1035_label(subdomain), SUBDOMAIN_TOO_LONG)
        ]
    if spec.get("managedBy") is not None:
        problems += domain_prefixed_path("spec.managedBy", spec["managedBy"])
        if len(spec["managedBy"]) > 63:
            problems.append("spec.managedBy: Too long: may not be more than 63 bytes")
    names: set[str] = set()
    for i, job in enumerate(jobs):
        names.add(job["name"])
        problems += _job_problems(name, i, job, names)
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            problems.append(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
    problems += _failure_policy_problems(spec, names)
    if spec.get("coordinator") is not None:
        problems += _coordinator_problems(jobset)
    return problems + _volume_claim_problems(jobset)


# What a suspended JobSet may change in its pod templates (ValidateUpdate's munging).
SUSPENDED_MUTABLE = ("annotations", "labels")
SUSPENDED_MUTABLE_SPEC = ("nodeSelector", "tolerations", "schedulingGates")


def update_problems(old: dict, new: dict) -> list[str]:
    """ValidateUpdate: replicatedJobs and managedBy are immutable (pod scheduling fields while suspended)."""
    munged, problems = copy.deepcopy(new["spec"].get("replicatedJobs") or []), []
    before = {j["name"]: j for j in old["spec"].get("replicatedJobs") or []}
    if old["spec"].get("suspend") or new["spec"].get("suspend"):
        for job in munged:
            if job["name"] not in before:
                continue
            template = job["template"]["spec"].setdefault("template", {})
            old_template = before[job["name"]]["template"]["spec"].get("template", {})
            for key in SUSPENDED_MUTABLE:
                _copy_field(template.setdefault("metadata", {}), old_template.get("metadata", {}), key)
            for key in SUSPENDED_MUTABLE_SPEC:
                _copy_field(template.setdefault("spec", {}), old_template.get("spec", {}), key)
    if munged != (old["spec"].get("replicatedJobs") or []):
        problems.append(invalid("spec.replicatedJobs", "array", "field is immutable"))
    if new["spec"].get("managedBy") != old["spec"].get("managedBy"):
        problems.append(invalid("spec.managedBy", new["spec"].get("managedBy"), "field is immutable"))
    return problems


def _copy_field(target: dict, source: dict, key: str) -> None:
    if key in source:
        target[key] = copy.deepcopy(source[key])
    else:
        target.pop(key, None)
