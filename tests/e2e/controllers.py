"""The controllers' part: what the Deployment, Job, JobSet, Kubeflow Training Operator (PyTorchJob v1.9) and
Kubeflow Trainer (TrainJob v2.2, torch-distributed runtime) controllers do with a rendered object.

Each one makes the pods its controller would make (names, hostnames, labels, annotations, the environment it
injects) and applies the failure semantics the object renders: which failure restarts a pod in place (the
kubelet, restartPolicy), which replaces a pod or the whole set, and which fails the job. Injected variables:
- Job (Indexed): JOB_COMPLETION_INDEX, hostname NAME-INDEX (DNS NAME-INDEX.SUBDOMAIN via a headless Service).
- JobSet: child Jobs NAME-RJOB-J, pods NAME-RJOB-J-I under the subdomain NAME (its own headless Service);
  JobSet sets labels and annotations only, no variables (jobset_controller.go / pod webhook).
- PyTorchJob (training-operator v1.9 envvar.go, master.go, elastic.go): PYTHONUNBUFFERED, MASTER_ADDR and
  PET_MASTER_ADDR (NAME-master-0), MASTER_PORT and PET_MASTER_PORT (the `pytorchjob-port` of the `pytorch`
  container), WORLD_SIZE, RANK, PET_NODE_RANK, PET_NPROC_PER_NODE (spec.nprocPerNode, default "auto"),
  PET_NNODES; elastic: PET_RDZV_ENDPOINT (NAME-worker-0:port), PET_RDZV_BACKEND, PET_NNODES=min:max,
  PET_MAX_RESTARTS; one Service per replica (NAME-master-0, NAME-worker-N).
- TrainJob (trainer v2.2 torch plugin): PET_NNODES, PET_NPROC_PER_NODE ("auto" becomes the CPU request without
  GPUs), PET_NODE_RANK (fieldRef to the completion index), PET_MASTER_ADDR NAME-node-0-0.NAME, PET_MASTER_PORT
  29500; the runtime's JobSet with the TrainJob's trainer fields and the runtimePatches merged in.
  With the TrainJobStatus feature gate (the cluster's `trainer_status`; v2.2 trainjobstatus plugin):
  KUBEFLOW_TRAINER_SERVER_URL/_CA_CERT/_TOKEN and the projected volume behind the last two, plus the
  NAME-tls-config ConfigMap holding the CA.
A custom resource is admitted first as a real API server with the operators installed admits it (its CRD's
CEL rules and the operator's webhooks, tests/k8s_rules): what a real cluster refuses is Denied at creation.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from k8s_rules import admission
from k8s_rules.trainer import TORCH_DISTRIBUTED

from .kubelet import BACKOFF_S, Pod, PodRequest, Refused, Unschedulable, known

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


class Denied(AssertionError):
    """The API server refused the object (a CRD's CEL rule or an operator's admission webhook): it never ran."""


def admitted(document: dict) -> dict:
    """The custom resource as the API server with the operators installed stores it (their defaults filled in);
    Denied, one line per refusal in the operator's words, where a real cluster refuses the create."""
    result = admission.admit(document)
    if result.problems:
        raise Denied("\n".join(result.problems))
    return result.obj


class Outcome:
    """How a workload ended, with what its controller did on the way."""

    def __init__(self) -> None:
        self.state = ""  # "" while running, then Succeeded or Failed
        self.reason = ""
        self.events: list[str] = []
        self.exit_codes: list[tuple[str, int]] = []  # (pod, exit code) of every pod that ended
        self.logs: list[tuple[str, str]] = []  # (pod, log) of every pod that ended

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def end(self, state: str, reason: str) -> None:
        if not self.state:
            self.state, self.reason = state, reason
            self.note(f"{state}: {reason}")


class Controller:
    """Common parts: the pods a controller owns and how they are made and deleted."""

    def __init__(self, cluster, document: dict):
        self.cluster, self.document = cluster, document
        self.name = document["metadata"]["name"]
        self.outcome = Outcome()
        self.pods: dict[str, Pod] = {}  # pod name -> the current pod of that name

    @property
    def kubelet(self):
        return self.cluster.kubelet

    def make(self, request: PodRequest) -> Pod | None:
        try:
            pod = self.kubelet.create(request)
        except Unschedulable:
            return None  # Pending: tried again at the next reconcile
        self.pods[request.name] = pod
        return pod

    def finished(self, pod: Pod) -> None:
        self.outcome.exit_codes.append((pod.name, pod.exit_code))
        self.outcome.logs.append((pod.name, pod.log))
        if pod.restarts:
            self.outcome.note(
                f"{pod.name}: its container was restarted in place {pod.restarts} time(s) (restartPolicy)"
            )

    def delete_all(self, only_running: bool = False) -> None:
        """Delete pods (gracefully: SIGTERM, then SIGKILL after their grace period)."""
        for pod in list(self.pods.values()):
            if not only_running or not pod.done:
                if not pod.done:
                    self.outcome.note(f"delete {pod.name}")
                running = not pod.done
                self.kubelet.delete(pod)
                if running:
                    self.finished(pod)
        if not only_running:
            self.pods.clear()

    def reconcile(self) -> str:
        raise NotImplementedError

    def current(self) -> list[Pod]:
        """The pods the controller has now."""
        return list(self.pods.values())


# -- batch/v1 Job ------------------------------------------------------------------------------------------
class JobController(Controller):
    """A Job: indexes (Indexed) or completions, restartPolicy in the kubelet, podFailurePolicy and backoffLimit."""

    def __init__(self, cluster, document: dict, name: str | None = None, labels: dict | None = None, env=()):
        super().__init__(cluster, document)
        self.name = name or self.name
        spec = known(
            document["spec"],
            f"Job {self.name}.spec",
            {
                "completionMode",
                "completions",
                "parallelism",
                "backoffLimit",
                "podFailurePolicy",
                "template",
                "ttlSecondsAfterFinished",
                "activeDeadlineSeconds",
            },
        )
        self.spec = spec
        self.indexed = spec.get("completionMode") == "Indexed"
        self.completions = int(spec.get("completions", 1))
        if int(spec.get("parallelism", self.completions)) != self.completions:
            raise Refused(f"Job {self.name}: parallelism below completions is not played")
        self.backoff_limit = int(spec.get("backoffLimit", 6))
        self.rules = known(spec.get("podFailurePolicy", {"rules": []}), "podFailurePolicy", {"rules"})["rules"]
        template = known(spec["template"], "template", {"metadata", "spec"})
        self.template = template
        self.labels = {**(template.get("metadata", {}).get("labels") or {}), **(labels or {})}
        self.annotations = dict(template.get("metadata", {}).get("annotations") or {})
        self.env = list(env)
        self.subdomain = template["spec"].get("subdomain", "")
        self.failures = 0
        self.succeeded: set[int] = set()
        self.not_before: dict[int, float] = {}
        self.deadline = time.monotonic() + float(spec.get("activeDeadlineSeconds") or 10**9)
        for index in range(self.completions):
            self.cluster.subdomain(self.hostname(index), self.subdomain, self.labels)

    def hostname(self, index: int) -> str:
        return f"{self.name}-{index}"

    def request(self, index: int) -> PodRequest:
        spec = copy.deepcopy(self.template["spec"])
        spec.pop("subdomain", None)
        annotations, env = dict(self.annotations), list(self.env)
        if self.indexed:
            annotations[INDEX_ANNOTATION] = str(index)
            env.append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        hostname = self.hostname(index) if self.indexed else ""
        return PodRequest(self.hostname(index), spec, dict(self.labels), annotations, env, hostname)

    def start(self) -> None:
        self.outcome.note(f"Job {self.name}: {self.completions} pods")

    def reconcile(self) -> str:
        if self.outcome.state:
            return self.outcome.state
        if time.monotonic() > self.deadline:
            self.fail("DeadlineExceeded")
            return self.outcome.state
        now = time.monotonic()
        for index in range(self.completions):
            if index in self.succeeded:
                continue
            name = self.hostname(index)
            pod = self.pods.get(name)
            if pod is None:
                if now >= self.not_before.get(index, 0):
                    self.make(self.request(index))
                continue
            restarts = sum(p.restarts for p in self.pods.values())
            if pod.restart_policy == "OnFailure" and self.failures + restarts > self.backoff_limit:
                self.fail("BackoffLimitExceeded (container restarts)")
                return self.outcome.state
            if not pod.done:
                continue
            self.finished(pod)
            self.kubelet.delete(pod)
            del self.pods[name]
            if pod.phase == "Succeeded":
                self.succeeded.add(index)
                continue
            action = self.policy(pod)
            self.outcome.note(f"pod {name} exited {pod.exit_code}: podFailurePolicy {action}")
            if action == "FailJob":
                self.fail(f"PodFailurePolicy: {name} exited {pod.exit_code}")
                return self.outcome.state
            if action == "Count":
                self.failures += 1
                if self.failures > self.backoff_limit:
                    self.fail("BackoffLimitExceeded")
                    return self.outcome.state
                self.not_before[index] = now + BACKOFF_S * 2 ** (self.failures - 1)
        if len(self.succeeded) == self.completions:
            self.outcome.end("Succeeded", f"{self.completions} completions")
        return self.outcome.state

    def policy(self, pod: Pod) -> str:
        """The first podFailurePolicy rule that matches the failed pod's action (Count when none does)."""
        for rule in self.rules:
            known(rule, "podFailurePolicy.rules[]", {"action", "onExitCodes", "onPodConditions"})
            if "onExitCodes" in rule:
                codes = known(rule["onExitCodes"], "onExitCodes", {"containerName", "operator", "values"})
                name = pod.request.spec["containers"][0]["name"]
                if codes.get("containerName", name) != name or not pod.exit_code:
                    continue
                inside = pod.exit_code in codes["values"]
                if inside == (codes["operator"] == "In"):
                    return rule["action"]
            for condition in rule.get("onPodConditions", []):
                known(condition, "onPodConditions[]", {"type", "status"})
                if condition["type"] in pod.conditions and condition.get("status", "True") == "True":
                    return rule["action"]
        return "Count"

    def fail(self, reason: str) -> None:
        """The Job failed: its running pods are terminated."""
        self.outcome.end("Failed", reason)
        self.delete_all()


# -- apps/v1 Deployment ------------------------------------------------------------------------------------
class DeploymentController(Controller):
    """A Deployment: `replicas` pods kept running (restartPolicy Always in the kubelet)."""

    def __init__(self, cluster, document: dict):
        super().__init__(cluster, document)
        spec = known(document["spec"], f"Deployment {self.name}.spec", {"replicas", "strategy", "selector", "template"})
        self.replicas = int(spec.get("replicas", 1))
        known(spec.get("strategy", {}), "strategy", {"type"})
        self.template = known(spec["template"], "template", {"metadata", "spec"})
        self.labels = self.template["metadata"]["labels"]
        selector = known(spec["selector"], "selector", {"matchLabels"})["matchLabels"]
        if any(self.labels.get(k) != v for k, v in selector.items()):
            raise AssertionError(f"Deployment {self.name}: selector {selector} does not select its template's labels")

    def start(self) -> None:
        for replica in range(self.replicas):
            request = PodRequest(
                f"{self.name}-{replica}",
                copy.deepcopy(self.template["spec"]),
                dict(self.labels),
                dict(self.template["metadata"].get("annotations") or {}),
            )
            self.make(request)

    def reconcile(self) -> str:
        return ""

    def ready(self) -> bool:
        return len(self.pods) == self.replicas and all(pod.ready for pod in self.pods.values())


# -- JobSet --------------------------------------------------------------------------------------------------
class JobSetController(Controller):
    """A JobSet: child Indexed Jobs; a failed Job restarts the whole set (failurePolicy.maxRestarts) or fails it."""

    def __init__(self, cluster, document: dict):
        admitted(document)  # the webhook's defaults are played below, as each one is read
        super().__init__(cluster, document)
        spec = known(
            document["spec"],
            f"JobSet {self.name}.spec",
            {"network", "failurePolicy", "replicatedJobs", "ttlSecondsAfterFinished", "successPolicy"},
        )
        network = known(spec.get("network", {}), "network", {"enableDNSHostnames", "publishNotReadyAddresses"})
        self.dns = network.get("enableDNSHostnames", True)  # the webhook's default
        self.max_restarts = int(
            known(spec.get("failurePolicy", {}), "failurePolicy", {"maxRestarts"}).get("maxRestarts", 0)
        )
        self.replicated = [
            known(r, "replicatedJobs[]", {"name", "replicas", "template"}) for r in spec["replicatedJobs"]
        ]
        self.restarts = 0
        self.jobs: list[JobController] = []

    def start(self) -> None:
        self.jobs = []
        for replicated in self.replicated:
            template = copy.deepcopy(replicated["template"])
            pod_spec = template["spec"]["template"]["spec"]
            pod_spec.setdefault("restartPolicy", "OnFailure")  # the JobSet webhook's default
            template["spec"].setdefault("completionMode", "Indexed")
            labels = {
                "jobset.sigs.k8s.io/jobset-name": self.name,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                "jobset.sigs.k8s.io/restart-attempt": str(self.restarts),
            }
            if self.dns:
                pod_spec["subdomain"] = self.name
            headless = {"spec": {"clusterIP": "None", "selector": {"jobset.sigs.k8s.io/jobset-name": self.name}}}
            for job_index in range(int(replicated.get("replicas", 1))):
                child = {**template, "metadata": {"name": f"{self.name}-{replicated['name']}-{job_index}"}}
                job = JobController(
                    self.cluster, child, labels={**labels, "jobset.sigs.k8s.io/job-index": str(job_index)}
                )
                # One record for the whole set: the child Jobs write into the JobSet's.
                job.outcome.events, job.outcome.exit_codes = self.outcome.events, self.outcome.exit_codes
                job.outcome.logs = self.outcome.logs
                for index in range(job.completions):
                    self.cluster.subdomain(job.hostname(index), self.name, job.labels, headless)
                self.jobs.append(job)
        self.outcome.note(f"JobSet {self.name}: start (restart {self.restarts})")

    def reconcile(self) -> str:
        if self.outcome.state:
            return self.outcome.state
        states = [job.reconcile() for job in self.jobs]
        for job in self.jobs:
            self.outcome.exit_codes += [c for c in job.outcome.exit_codes if c not in self.outcome.exit_codes]
            self.outcome.logs += [c for c in job.outcome.logs if c not in self.outcome.logs]
        failed = [job for job, state in zip(self.jobs, states, strict=True) if state == "Failed"]
        if failed:
            for job in self.jobs:
                job.delete_all()
            reason = f"Job {failed[0].name} failed ({failed[0].outcome.reason})"
            if self.restarts < self.max_restarts:
                self.restarts += 1
                self.outcome.note(f"{reason}: restart the whole set ({self.restarts}/{self.max_restarts})")
                self.start()
            else:
                self.outcome.end("Failed", f"{reason}; restarts {self.restarts}/{self.max_restarts}")
        elif all(state == "Succeeded" for state in states):
            self.outcome.end("Succeeded", "every Job completed")
        return self.outcome.state

    def delete_all(self, only_running: bool = False) -> None:
        for job in self.jobs:
            job.delete_all(only_running)

    def current(self) -> list[Pod]:
        return [pod for job in self.jobs for pod in job.pods.values()]


# -- Kubeflow Training Operator v1.9: PyTorchJob -------------------------------------------------------------
class PyTorchJobController(Controller):
    """PyTorchJob: Master/Worker pods with the operator's variables; ExitCode, OnFailure and cleanPodPolicy."""

    def __init__(self, cluster, document: dict):
        admitted(document)
        super().__init__(cluster, document)
        spec = known(
            document["spec"],
            f"PyTorchJob {self.name}.spec",
            {"elasticPolicy", "runPolicy", "pytorchReplicaSpecs", "nprocPerNode"},
        )
        self.elastic = known(
            spec.get("elasticPolicy") or {},
            "elasticPolicy",
            {"minReplicas", "maxReplicas", "maxRestarts", "rdzvBackend"},
        )
        run = known(
            spec["runPolicy"],
            "runPolicy",
            {"cleanPodPolicy", "backoffLimit", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "schedulingPolicy"},
        )
        self.clean = run.get("cleanPodPolicy", "None")
        self.backoff_limit = run.get("backoffLimit")
        self.nproc = str(spec.get("nprocPerNode", "auto"))  # the operator's default
        self.replicas = {}
        for rtype, replica in spec["pytorchReplicaSpecs"].items():
            if rtype not in ("Master", "Worker"):
                raise Refused(f"pytorchReplicaSpecs.{rtype}")
            self.replicas[rtype] = known(replica, rtype, {"replicas", "restartPolicy", "template"})
        self.total = sum(int(r["replicas"]) for r in self.replicas.values())

    def port(self, rtype: str) -> int:
        """The operator's port: `pytorchjob-port` of the container named `pytorch` (an error without one)."""
        for container in self.replicas[rtype]["template"]["spec"]["containers"]:
            if container["name"] == "pytorch":
                for port in container.get("ports", []):
                    if port.get("name") == "pytorchjob-port":
                        return int(port["containerPort"])
        raise AssertionError(
            f"PyTorchJob {self.name}: the operator finds no pytorchjob-port on a container named pytorch"
        )

    def env(self, rtype: str, index: int) -> list[dict]:
        values = {"PYTHONUNBUFFERED": "1"}
        if "Master" in self.replicas:
            port, master = str(self.port("Master")), f"{self.name}-master-0"
            rank = index + (1 if rtype == "Worker" else 0)
            nproc = int(self.nproc) if self.nproc.isdigit() else 1
            values |= {
                "MASTER_PORT": port,
                "PET_MASTER_PORT": port,
                "MASTER_ADDR": master,
                "PET_MASTER_ADDR": master,
                "WORLD_SIZE": str(self.total * nproc),
                "RANK": str(rank),
                "PET_NODE_RANK": str(rank),
            }
        values["PET_NPROC_PER_NODE"] = self.nproc
        if self.elastic:
            values |= {
                "PET_RDZV_ENDPOINT": f"{self.name}-worker-0:{self.port('Worker')}",
                "PET_RDZV_BACKEND": self.elastic.get("rdzvBackend", "c10d"),
                "PET_NNODES": f"{self.elastic['minReplicas']}:{self.elastic['maxReplicas']}",
            }
            if "maxRestarts" in self.elastic:
                values["PET_MAX_RESTARTS"] = str(self.elastic["maxRestarts"])
        else:
            values["PET_NNODES"] = str(self.total)
        return [{"name": key, "value": value} for key, value in values.items()]

    def names(self) -> list[tuple[str, int, str]]:
        return [
            (rtype, index, f"{self.name}-{rtype.lower()}-{index}")
            for rtype, replica in self.replicas.items()
            for index in range(int(replica["replicas"]))
        ]

    def start(self) -> None:
        for _, _, name in self.names():
            self.cluster.publish(name, name)  # the operator's Service per replica
        self.outcome.note(f"PyTorchJob {self.name}: {self.total} pods")

    def request(self, rtype: str, index: int, name: str) -> PodRequest:
        replica = self.replicas[rtype]
        spec = copy.deepcopy(replica["template"]["spec"])
        policy = replica.get("restartPolicy", "Never")
        spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy  # the operator sets the pod's
        labels = {
            **(replica["template"].get("metadata", {}).get("labels") or {}),
            "training.kubeflow.org/job-name": self.name,
            "training.kubeflow.org/replica-type": rtype.lower(),
            "training.kubeflow.org/replica-index": str(index),
        }
        return PodRequest(name, spec, labels, {}, self.env(rtype, index), name)

    def reconcile(self) -> str:
        if self.outcome.state:
            return self.outcome.state
        for rtype, index, name in self.names():
            pod = self.pods.get(name)
            if pod is None:
                self.make(self.request(rtype, index, name))
                continue
            if not pod.done:
                continue
            self.finished(pod)
            if pod.phase == "Succeeded":
                if rtype == "Master" or self.elastic:
                    self.outcome.end("Succeeded", f"{name} completed")
                    self.cleanup()
                    return self.outcome.state
                continue
            policy = self.replicas[rtype].get("restartPolicy", "Never")
            self.kubelet.delete(pod)
            del self.pods[name]
            if policy == "ExitCode" and pod.exit_code >= 128:
                self.outcome.note(f"{name} exited {pod.exit_code} (retryable under ExitCode): new pod")
                continue
            self.outcome.end("Failed", f"{name} exited {pod.exit_code} ({policy}: not retryable)")
            self.cleanup()
            return self.outcome.state
        restarts = sum(pod.restarts for pod in self.pods.values() if pod.phase == "Running")
        if self.backoff_limit is not None and restarts and restarts >= int(self.backoff_limit):
            self.outcome.end("Failed", f"BackoffLimitExceeded: {restarts} container restarts")
            self.cleanup()
        return self.outcome.state

    def cleanup(self) -> None:
        """cleanPodPolicy: Running deletes the pods still running, All every pod, None none."""
        if self.clean in ("Running", "All"):
            self.delete_all(only_running=self.clean == "Running")


# -- Kubeflow Trainer v2.2: TrainJob against the torch-distributed ClusterTrainingRuntime ------------------------
# The runtime as Kubeflow Trainer v2.2 ships it (manifests/base/runtimes/torch_distributed.yaml).
TRAINER_PORT = 29500
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
}


def strategic_merge(base, patch, key: str = ""):
    """Kubernetes' strategic merge patch for pod templates: maps merge, named lists merge by their key."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            merged[name] = strategic_merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field, merged = MERGE_KEYS[key], [copy.deepcopy(item) for item in base]
        for item in patch:
            match = next((i for i, old in enumerate(merged) if old.get(field) == item.get(field)), None)
            if match is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[match] = strategic_merge(merged[match], item)
        return merged
    return copy.deepcopy(patch)


# -- Kubeflow Trainer v2.2+: the TrainJobStatus plugin (pkg/runtime/framework/plugins/trainjobstatus) ---------
STATUS_MOUNT = "/var/run/secrets/kubeflow/trainer"
STATUS_VOLUME = "kubeflow-trainer-token"


@dataclass(frozen=True)
class StatusGate:
    """The TrainJobStatus feature gate on: where the controller's status server listens (its Service's
    https://HOST:PORT) and the CA that signs its certificate."""

    base_url: str
    ca_pem: str


def status_audience(namespace: str, name: str) -> str:
    """The audience of a TrainJob's projected token (pkg/statusserver TokenAudience)."""
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_config_map(name: str, gate: StatusGate) -> dict:
    """The ConfigMap the plugin builds for a TrainJob: the CA, copied from the controller's webhook certificate."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-tls-config"},
        "data": {"ca.crt": gate.ca_pem},
    }


def status_injection(name: str, container: dict, pod: dict, gate: StatusGate) -> None:
    """Play the plugin on a trainer pod: its variables (upserted), its mount and its projected volume."""
    path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{name}/status"
    variables = {
        "KUBEFLOW_TRAINER_SERVER_URL": gate.base_url + path,
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": f"{STATUS_MOUNT}/ca.crt",
        "KUBEFLOW_TRAINER_SERVER_TOKEN": f"{STATUS_MOUNT}/token",
    }
    container["env"] = [e for e in container.get("env", []) if e["name"] not in variables]
    container["env"] += [{"name": key, "value": value} for key, value in variables.items()]
    mounts = [m for m in container.get("volumeMounts", []) if m["name"] != STATUS_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": STATUS_VOLUME, "mountPath": STATUS_MOUNT, "readOnly": True}]
    token = {"audience": status_audience("default", name), "expirationSeconds": 3600, "path": "token"}
    config_map = {"name": f"{name}-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    volume = {
        "name": STATUS_VOLUME,
        "projected": {"sources": [{"serviceAccountToken": token}, {"configMap": config_map}]},
    }
    pod["volumes"] = [*(v for v in pod.get("volumes", []) if v["name"] != STATUS_VOLUME), volume]


def trainjob_to_jobset(document: dict, status: StatusGate | None = None) -> dict:
    """The JobSet Kubeflow Trainer makes of a TrainJob on the torch-distributed runtime (after admitting it),
    its trainer pods with the status endpoint's variables and volume when the TrainJobStatus gate is on."""
    admitted(document)
    name = document["metadata"]["name"]
    spec = known(
        document["spec"], f"TrainJob {name}.spec", {"runtimeRef", "trainer", "runtimePatches", "activeDeadlineSeconds"}
    )
    ref = known(spec["runtimeRef"], "runtimeRef", {"apiGroup", "kind", "name"})
    if (ref["kind"], ref["name"]) != ("ClusterTrainingRuntime", "torch-distributed"):
        raise Refused(f"runtimeRef {ref['kind']}/{ref['name']}: only the torch-distributed runtime is played")
    trainer = known(
        spec["trainer"],
        "trainer",
        {"image", "command", "args", "numNodes", "resourcesPerNode", "env", "numProcPerNode"},
    )
    jobset = copy.deepcopy(TORCH_DISTRIBUTED["template"]["spec"])
    for patch in spec.get("runtimePatches", []):
        known(patch, "runtimePatches[]", {"manager", "trainingRuntimeSpec"})
        runtime = known(patch["trainingRuntimeSpec"], "trainingRuntimeSpec", {"template"})
        template = known(runtime["template"], "trainingRuntimeSpec.template", {"spec"})
        for job_patch in known(template["spec"], "template.spec", {"replicatedJobs"})["replicatedJobs"]:
            for job in jobset["replicatedJobs"]:
                if job["name"] == job_patch["name"]:
                    job["template"] = strategic_merge(job["template"], job_patch["template"])
    job = next(j for j in jobset["replicatedJobs"] if j["name"] == "node")
    nodes = int(trainer.get("numNodes", TORCH_DISTRIBUTED["mlPolicy"]["numNodes"]))
    job["template"]["spec"] |= {"parallelism": nodes, "completions": nodes}
    pod = job["template"]["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "node")
    for key in ("image", "command", "args"):
        if key in trainer:
            container[key] = trainer[key]
    resources = trainer.get("resourcesPerNode") or {}
    if resources:
        container["resources"] = resources
    procs = str(trainer.get("numProcPerNode", "auto"))
    gpus = int((resources.get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
    if procs == "auto" and not gpus:
        cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu") or 0
        procs = str(max(1, int(float(str(cpu).rstrip("m")) / (1000 if str(cpu).endswith("m") else 1))))
    container["env"] = [
        *container.get("env", []),
        *trainer.get("env", []),
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": procs},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
        },
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ]
    container["ports"] = [*container.get("ports", []), {"containerPort": TRAINER_PORT}]
    if status:
        status_injection(name, container, pod, status)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": jobset}
