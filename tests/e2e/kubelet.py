"""The kubelet's part, played with podman: one rendered pod spec becomes one `podman run`, field by field.

Every field of a pod spec is either mapped onto podman or refused: `Refused` names the first field this
translator does not understand, so a chart change can never be skipped silently. What each field becomes:

- securityContext: runAsUser/runAsGroup → --user, fsGroup → --group-add plus the volume's group (the kubelet
  chowns a claim or emptyDir to it), runAsNonRoot → checked, seccompProfile RuntimeDefault → podman's default
  profile, allowPrivilegeEscalation: false → no-new-privileges, readOnlyRootFilesystem → --read-only without
  podman's own writable /tmp and /run (--read-only-tmpfs=false), capabilities → --cap-drop/--cap-add.
- volumes: configMap → its rendered data written to files and mounted read-only (subPath: one file);
  emptyDir → a fresh 0777 directory kept for the pod's life (medium: Memory → tmpfs of sizeLimit);
  persistentVolumeClaim → a podman named volume that outlives pods, like a claim; projected (configMap and
  serviceAccountToken sources: Kubeflow Trainer's status volume) → the files written, mounted read-only, the
  token the cluster's stand-in for the audience (no API server issues a real one; it does not rotate).
- resources: limits.memory → --memory, limits.cpu → --cpus; requests are the scheduler's (one node here);
  any other resource (nvidia.com/gpu) is refused: this machine has none.
- restartPolicy: Always/OnFailure → the container is started again in the same pod, volumes kept, after the
  kubelet's back-off (10 s doubling); Never → the pod ends Succeeded or Failed with the exit code.
- probes (httpGet) → probed from the host at the pod's IP, as the kubelet does; readiness gates Services,
  liveness restarts the container.
- terminationGracePeriodSeconds → the seconds between SIGTERM and SIGKILL when the pod is deleted.
- env (value, fieldRef to metadata), command/args, image (present locally: no registry here), ports.
Each pod has its own IP on the cluster's bridge network and its hostname; DNS is /etc/hosts (--add-host).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SECCOMP_DEFAULT = "/usr/share/containers/seccomp.json"
BACKOFF_S = 10.0  # the kubelet's first restart back-off (then doubling, up to 5 min)


class Refused(AssertionError):
    """A pod spec field the translator does not understand (so it cannot have been run as specified)."""


def known(mapping: dict, path: str, keys: set[str]) -> dict:
    """`mapping` when every key is one of `keys`; otherwise Refused naming the first unknown field."""
    if not isinstance(mapping, dict):
        raise Refused(f"{path}: expected a mapping, got {mapping!r}")
    for key in mapping:
        if key not in keys:
            raise Refused(f"{path}.{key}: not understood by the podman translator")
    return mapping


def quantity(text: Any) -> float:
    """A Kubernetes quantity ("4Gi", "500m", 2) as a number (bytes or cores)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not match or (match.group(2) and match.group(2) not in units):
        raise Refused(f"quantity {text!r}: not understood")
    return float(match.group(1)) * units.get(match.group(2), 1)


@dataclass
class PodRequest:
    """A pod as a controller creates it: the template's spec plus what the controller adds."""

    name: str
    spec: dict
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    env: list = field(default_factory=list)  # the controller's variables, after the container's own
    hostname: str = ""


@dataclass
class Pod:
    """A running (or finished) pod: its container, volumes, probe state and restart count."""

    request: PodRequest
    container: str
    ip: str
    root: Path
    args: list[str]
    restart_policy: str
    grace: int
    probes: dict
    phase: str = "Pending"
    exit_code: int | None = None
    restarts: int = 0
    ready: bool = False
    conditions: set = field(default_factory=set)
    started: float = 0.0
    restart_at: float = 0.0
    deleting: bool = False
    next_probe: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    log: str = ""

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def labels(self) -> dict:
        return self.request.labels

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class Kubelet:
    """Creates, watches, restarts and deletes pods with podman on the cluster's network."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.engine = cluster.engine
        self.pods: dict[str, Pod] = {}

    # -- translation ---------------------------------------------------------------------------------
    def translate(self, request: PodRequest, ip: str, root: Path) -> tuple[list[str], dict, str, int]:
        """podman run arguments for the pod, its probes, its restart policy and grace period."""
        spec = known(
            request.spec,
            "spec",
            {
                "restartPolicy",
                "serviceAccountName",
                "automountServiceAccountToken",
                "terminationGracePeriodSeconds",
                "securityContext",
                "subdomain",
                "hostname",
                "containers",
                "volumes",
                "affinity",
            },
        )
        self._service_account(spec)
        self._affinity(spec.get("affinity"))
        if len(spec["containers"]) != 1:
            raise Refused("spec.containers: one container per pod is what the chart renders")
        container = known(
            spec["containers"][0],
            "spec.containers[0]",
            {
                "name",
                "image",
                "imagePullPolicy",
                "command",
                "args",
                "env",
                "ports",
                "resources",
                "securityContext",
                "volumeMounts",
                "readinessProbe",
                "livenessProbe",
            },
        )
        grace = int(spec.get("terminationGracePeriodSeconds", 30))
        args = [
            "run",
            "--detach",
            "--name",
            f"{self.cluster.prefix}-{request.name}",
            "--label",
            f"imagenet-train-e2e={self.cluster.prefix}",
            *self.cluster.owned,
            "--network",
            self.cluster.network,
            "--ip",
            ip,
            "--hostname",
            request.hostname or request.name,
            "--stop-timeout",
            str(grace),
            "--pull=never",
        ]
        for name, address in self.cluster.hosts().items():
            args += ["--add-host", f"{name}:{address}"]
        args += self._security(spec.get("securityContext", {}), container.get("securityContext", {}), container)
        args += self._resources(container.get("resources", {}))
        args += self._volumes(spec, container, root)
        args += self._env(container.get("env", []) + request.env, request, ip)
        for port in container.get("ports", []):
            known(port, "ports[]", {"name", "containerPort", "protocol"})
            if port.get("protocol", "TCP") != "TCP":
                raise Refused(f"ports[{port.get('name')}]: only TCP")
        pull = container.get("imagePullPolicy", "IfNotPresent")
        if pull not in ("IfNotPresent", "Never") or not self.engine.exists(container["image"]):
            raise Refused(f"image {container['image']} ({pull}): not on this machine and no registry to pull from")
        for key in ("command", "args"):
            if any("$(" in str(part) for part in container.get(key, [])):
                raise Refused(f"{key}: $(VAR) expansion is not implemented")
        if "command" in container:
            args += ["--entrypoint", json.dumps(container["command"])]
        args += [container["image"], *map(str, container.get("args", []))]
        probes = {
            kind: self._probe(container[kind], container)
            for kind in ("readinessProbe", "livenessProbe")
            if kind in container
        }
        policy = spec.get("restartPolicy", "Always")
        if policy not in ("Always", "OnFailure", "Never"):
            raise Refused(f"spec.restartPolicy: {policy}")
        return args, probes, policy, grace

    def _service_account(self, spec: dict) -> None:
        """A rendered ServiceAccount whose token is not mounted (nothing here could serve one)."""
        name = spec.get("serviceAccountName")
        if spec.get("automountServiceAccountToken") is True:
            raise Refused("spec.automountServiceAccountToken: true (no API server to issue a token)")
        if name is None or spec.get("automountServiceAccountToken") is False:
            return
        account = self.cluster.object("ServiceAccount", name)
        if account.get("automountServiceAccountToken") is not False:
            raise Refused(f"ServiceAccount {name}: mounts a token (no API server to issue one)")

    def _affinity(self, affinity: dict | None) -> None:
        """Pod affinity to pods on the same node: every pod runs on this one node, so it holds once such a
        pod runs (the scheduler would keep this pod Pending until then)."""
        if not affinity:
            return
        known(affinity, "spec.affinity", {"podAffinity"})
        known(affinity["podAffinity"], "spec.affinity.podAffinity", {"requiredDuringSchedulingIgnoredDuringExecution"})
        for term in affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]:
            known(term, "podAffinity term", {"topologyKey", "labelSelector"})
            known(term["labelSelector"], "podAffinity labelSelector", {"matchLabels"})
            if term["topologyKey"] != "kubernetes.io/hostname":
                raise Refused(f"podAffinity topologyKey {term['topologyKey']}")
            wanted = term["labelSelector"]["matchLabels"]
            if not any(pod.phase == "Running" and selects(wanted, pod.labels) for pod in self.pods.values()):
                raise Unschedulable(f"no running pod with labels {wanted} on the node (podAffinity)")

    def _security(self, pod: dict, box: dict, container: dict) -> list[str]:
        known(pod, "spec.securityContext", {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"})
        known(
            box,
            "securityContext",
            {
                "allowPrivilegeEscalation",
                "readOnlyRootFilesystem",
                "runAsNonRoot",
                "runAsUser",
                "runAsGroup",
                "capabilities",
            },
        )
        user = box.get("runAsUser", pod.get("runAsUser"))
        group = box.get("runAsGroup", pod.get("runAsGroup"))
        if user is None:
            configured = self.engine(
                "image", "inspect", container["image"], "--format", "{{.Config.User}}"
            ).stdout.strip()
            user = int(configured.split(":")[0]) if configured.split(":")[0].isdigit() else None
        if (box.get("runAsNonRoot") or pod.get("runAsNonRoot")) and not user:
            raise Refused("runAsNonRoot: the container would run as root (or as a user name the kubelet cannot check)")
        args = ["--user", f"{user}:{group}" if group is not None else str(user)]
        if "fsGroup" in pod:
            args += ["--group-add", str(pod["fsGroup"])]
        seccomp = pod.get("seccompProfile")
        if seccomp:
            known(seccomp, "seccompProfile", {"type"})
            if seccomp["type"] != "RuntimeDefault":
                raise Refused(f"seccompProfile {seccomp['type']}")
            args += ["--security-opt", f"seccomp={SECCOMP_DEFAULT}"]
        if box.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if box.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        capabilities = known(box.get("capabilities", {}), "capabilities", {"drop", "add"})
        args += [item for cap in capabilities.get("drop", []) for item in ("--cap-drop", cap)]
        args += [item for cap in capabilities.get("add", []) for item in ("--cap-add", cap)]
        return args

    def _resources(self, resources: dict) -> list[str]:
        known(resources, "resources", {"requests", "limits"})
        for kind in ("requests", "limits"):
            for name in resources.get(kind) or {}:
                if name not in ("cpu", "memory"):
                    raise Refused(f"resources.{kind}.{name}: this machine has no such resource")
        limits, args = resources.get("limits") or {}, []
        if "memory" in limits:
            args += ["--memory", str(int(quantity(limits["memory"])))]
        if "cpu" in limits:
            args += ["--cpus", str(quantity(limits["cpu"]))]
        return args

    def _volumes(self, spec: dict, container: dict, root: Path) -> list[str]:
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        sources = {}
        for volume in spec.get("volumes", []):
            known(
                volume,
                f"volumes[{volume.get('name')}]",
                {"name", "configMap", "emptyDir", "persistentVolumeClaim", "projected"},
            )
            sources[volume["name"]] = volume
        args = []
        for mount in container.get("volumeMounts", []):
            known(mount, f"volumeMounts[{mount.get('name')}]", {"name", "mountPath", "readOnly", "subPath"})
            volume = sources.get(mount["name"])
            if volume is None:
                raise Refused(f"volumeMounts[{mount['name']}]: no such volume in the pod")
            target, read_only = mount["mountPath"], bool(mount.get("readOnly"))
            if "configMap" in volume:
                path = self._config_map(volume["configMap"], root / "volumes" / volume["name"])
                if mount.get("subPath"):
                    path = path / mount["subPath"]
                args += ["--volume", f"{path}:{target}:ro"]
                continue
            if mount.get("subPath"):
                raise Refused(f"volumeMounts[{mount['name']}].subPath on a {next(iter(set(volume) - {'name'}))}")
            if "projected" in volume:
                args += [
                    "--volume",
                    f"{self._projected(volume['projected'], root / 'volumes' / volume['name'])}:{target}:ro",
                ]
                continue
            if "emptyDir" in volume:
                empty = known(volume["emptyDir"] or {}, "emptyDir", {"medium", "sizeLimit"})
                if empty.get("medium") == "Memory":
                    size = int(quantity(empty.get("sizeLimit", "64Mi")))
                    args += ["--mount", f"type=tmpfs,destination={target},tmpfs-size={size},tmpfs-mode=1777"]
                    continue
                if empty.get("medium") not in (None, ""):
                    raise Refused(f"emptyDir medium {empty['medium']}")
                path = root / "volumes" / volume["name"]
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)
                own(path, fs_group)
                args += ["--volume", f"{path}:{target}{':ro' if read_only else ''}"]
            else:
                claim = known(volume["persistentVolumeClaim"], "persistentVolumeClaim", {"claimName", "readOnly"})
                name = self.cluster.claim(claim["claimName"])
                own(
                    Path(self.engine("volume", "inspect", name, "--format", "{{.Mountpoint}}").stdout.strip()), fs_group
                )
                read_only = read_only or bool(claim.get("readOnly"))
                args += ["--volume", f"{name}:{target}{':ro' if read_only else ''}"]
        return args

    def _projected(self, source: dict, folder: Path) -> Path:
        known(source, "projected", {"sources", "defaultMode"})
        if not folder.exists():
            folder.mkdir(parents=True)
            for item in source["sources"]:
                known(item, "projected.sources[]", {"configMap", "serviceAccountToken"})
                if "serviceAccountToken" in item:
                    token = known(
                        item["serviceAccountToken"], "serviceAccountToken", {"audience", "expirationSeconds", "path"}
                    )
                    (folder / token["path"]).write_text(self.cluster.service_account_token(token["audience"]))
                    continue
                config_map = known(item["configMap"], "projected configMap", {"name", "items"})
                data = self.cluster.object("ConfigMap", config_map["name"])["data"]
                for entry in config_map.get("items") or [{"key": key, "path": key} for key in data]:
                    known(entry, "configMap.items[]", {"key", "path"})
                    (folder / entry["path"]).write_text(data[entry["key"]])
            for file in folder.iterdir():
                file.chmod(source.get("defaultMode", 0o644))
        return folder

    def _config_map(self, source: dict, folder: Path) -> Path:
        known(source, "configMap", {"name", "items", "defaultMode"})
        data = self.cluster.object("ConfigMap", source["name"])["data"]
        items = source.get("items") or [{"key": key, "path": key} for key in data]
        if not folder.exists():
            folder.mkdir(parents=True)
            for item in items:
                known(item, "configMap.items[]", {"key", "path"})
                target = folder / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[item["key"]])
                target.chmod(source.get("defaultMode", 0o644))
        return folder

    def _env(self, entries: list, request: PodRequest, ip: str) -> list[str]:
        args = []
        for entry in entries:
            known(entry, f"env[{entry.get('name')}]", {"name", "value", "valueFrom"})
            value = entry.get("value", "")
            if "valueFrom" in entry:
                source = known(entry["valueFrom"], "valueFrom", {"fieldRef"})
                path = known(source["fieldRef"], "fieldRef", {"fieldPath", "apiVersion"})["fieldPath"]
                value = self._field(path, request, ip)
            args += ["--env", f"{entry['name']}={value}"]
        return args

    @staticmethod
    def _field(path: str, request: PodRequest, ip: str) -> str:
        """The downward API: metadata.name, status.podIP, metadata.labels['K'], metadata.annotations['K']."""
        if path == "metadata.name":
            return request.name
        if path == "status.podIP":
            return ip
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if not match:
            raise Refused(f"fieldRef {path}")
        return getattr(request, match.group(1))[match.group(2)]

    def _probe(self, probe: dict, container: dict) -> dict:
        known(
            probe,
            "probe",
            {
                "httpGet",
                "periodSeconds",
                "timeoutSeconds",
                "failureThreshold",
                "initialDelaySeconds",
                "successThreshold",
            },
        )
        get = known(probe["httpGet"], "probe.httpGet", {"path", "port"})
        return {
            "path": get.get("path", "/"),
            "port": container_port(container, get["port"]),
            "period": probe.get("periodSeconds", 10),
            "timeout": probe.get("timeoutSeconds", 1),
            "threshold": probe.get("failureThreshold", 3),
            "delay": probe.get("initialDelaySeconds", 0),
        }

    # -- life cycle ----------------------------------------------------------------------------------
    def create(self, request: PodRequest) -> Pod:
        """Run the pod (Refused for fields the translator does not understand, Unschedulable for affinity)."""
        if request.name in self.pods:
            raise AssertionError(f"pod {request.name} exists")
        ip = self.cluster.ip(request.hostname or request.name)
        root = self.cluster.root / "pods" / f"{request.name}-{time.monotonic_ns()}"
        root.mkdir(parents=True)
        args, probes, policy, grace = self.translate(request, ip, root)
        pod = Pod(request, f"{self.cluster.prefix}-{request.name}", ip, root, args, policy, grace, probes)
        self.engine(*args)
        pod.phase, pod.started = "Running", time.monotonic()
        for kind, probe in probes.items():
            pod.next_probe[kind] = pod.started + probe["delay"]
        self.pods[request.name] = pod
        return pod

    def poll(self) -> None:
        """Bring every pod's state up to date: exits, in-place restarts with back-off, probes."""
        live = [pod for pod in self.pods.values() if not pod.done]
        if not live:
            return
        states = self._states([pod.container for pod in live])
        now = time.monotonic()
        for pod in live:
            status, code = states.get(pod.container, ("missing", -1))
            if status in ("running", "created", "configured", "initialized"):
                self._probe_pod(pod, now)
                continue
            pod.ready, pod.exit_code = False, code
            restart = pod.restart_policy == "Always" or (pod.restart_policy == "OnFailure" and code != 0)
            if restart and not pod.deleting:
                if not pod.restart_at:
                    pod.restart_at = now + min(BACKOFF_S * 2 ** min(pod.restarts, 5), 300)
                elif now >= pod.restart_at:
                    self.engine("start", pod.container)
                    pod.restarts, pod.restart_at = pod.restarts + 1, 0.0
                    for kind, probe in pod.probes.items():
                        pod.next_probe[kind] = now + probe["delay"]
                continue
            pod.phase = "Succeeded" if code == 0 else "Failed"
            pod.log = self.logs(pod)

    def _states(self, containers: list[str]) -> dict[str, tuple[str, int]]:
        result = self.engine(
            "inspect", "--format", "{{.Name}} {{.State.Status}} {{.State.ExitCode}}", *containers, check=False
        )
        states = {}
        for line in result.stdout.splitlines():
            name, status, code = line.split()
            states[name] = (status, int(code))
        return states

    def _probe_pod(self, pod: Pod, now: float) -> None:
        for kind, probe in pod.probes.items():
            if now < pod.next_probe.get(kind, 0):
                continue
            pod.next_probe[kind] = now + probe["period"]
            try:
                with urllib.request.urlopen(
                    f"http://{pod.ip}:{probe['port']}{probe['path']}", timeout=probe["timeout"]
                ):
                    ok = True
            except OSError:
                ok = False
            pod.failures[kind] = 0 if ok else pod.failures.get(kind, 0) + 1
            if kind == "readinessProbe":
                pod.ready = ok or (pod.ready and pod.failures[kind] < probe["threshold"])
            elif pod.failures[kind] >= probe["threshold"]:
                self.engine("stop", "--time", str(pod.grace), pod.container, check=False)  # restarted by poll
                pod.failures[kind] = 0
        if not pod.probes:
            pod.ready = True

    def signal(self, pod: Pod, name: str) -> None:
        """Send a signal to the pod's main process (a crash or an OOM kill: SIGKILL)."""
        self.engine("kill", "--signal", name, pod.container)

    def delete(self, pod: Pod, disruption: bool = False) -> None:
        """Delete the pod as the API server would: SIGTERM, its grace period, SIGKILL; then its volumes."""
        if disruption:
            pod.conditions.add("DisruptionTarget")
        pod.deleting = True
        if not pod.done:
            self.engine("stop", "--time", str(pod.grace), pod.container, check=False, timeout=pod.grace + 60)
            self.poll()
            if not pod.done:
                code = self._states([pod.container]).get(pod.container, ("", 137))[1]
                pod.phase, pod.exit_code = ("Succeeded" if code == 0 else "Failed"), code
                pod.log = self.logs(pod)
        self.engine("rm", "--force", pod.container, check=False)
        shutil.rmtree(pod.root, ignore_errors=True)
        self.pods.pop(pod.name, None)

    def logs(self, pod: Pod) -> str:
        result = self.engine("logs", pod.container, check=False)
        text = result.stdout + result.stderr
        (self.cluster.root / "logs").mkdir(exist_ok=True)
        with open(self.cluster.root / "logs" / f"{pod.name}.log", "a") as stream:
            stream.write(f"--- {pod.container} (restarts {pod.restarts}, exit {pod.exit_code})\n{text}")
        return text


class Unschedulable(Exception):
    """The scheduler would keep this pod Pending for now."""


def selects(selector: dict, labels: dict) -> bool:
    """A label selector's matchLabels (or a Service's selector) against a pod's labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def container_port(container: dict, port: Any) -> int:
    """A port number, or a named port resolved in the container's ports (Refused when it has none such)."""
    if isinstance(port, int):
        return port
    for entry in container.get("ports", []):
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise Refused(f"port {port!r}: no container port of that name")


def own(path: Path, group: int | None) -> None:
    """What the kubelet does for fsGroup on a claim or emptyDir: group-owned, group-writable, setgid."""
    if group is None:
        return
    for folder, _dirs, files in os.walk(path):
        os.chown(folder, -1, group)
        os.chmod(folder, os.stat(folder).st_mode | 0o2070)
        for name in files:
            target = os.path.join(folder, name)
            os.chown(target, -1, group)
            os.chmod(target, os.stat(target).st_mode | 0o060)
