"""A one-node "cluster" made of podman: the objects a release renders, pod IPs and DNS, Services, claims.

- Network: a bridge network of its own (a /24 picked at random), so every pod has its own IP and the ports the
  chart renders are used as they are, as on Kubernetes. The host is the network's gateway; it runs what the
  cluster's control plane and its neighbours would: the Service proxies and the bucket (gcp-storage-emulator).
- DNS: /etc/hosts in each pod (--add-host), written when the pod starts. Names are stable, so each pod name
  keeps its IP across replacements (a Kubernetes DNS record follows the replacement pod the same way).
  A ClusterIP Service resolves to the gateway, where `ServiceProxy` (kube-proxy's part) forwards its port to
  the targetPort of a Ready pod its selector picks; a headless Service gives `HOSTNAME.SUBDOMAIN` to the pods
  it selects, and a controller can publish its own names (the PyTorchJob operator's per-replica Services).
- Claims: a PersistentVolumeClaim is a podman named volume; it outlives pods and releases (the chart keeps it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from imagebuild import Podman

from chartkit.objects import render

from .kubelet import Kubelet, Refused, container_port, selects

# Every container, pod, volume and network a session makes carries its host and pid, so a later session on the
# same host can tell what an aborted one left behind (its training pods would go on using the CPUs, its network
# would keep a subnet). What another host's session made (podman storage shared across containers) is left alone.
OWNER = "imagenet-train-e2e.owner"
# Kinds kept as configuration, not run. A NetworkPolicy is not enforced: podman's bridge has no policy engine
# (test_chart.py checks them); a PodMonitor waits for a Prometheus that does not run here (ranks still serve /metrics).
STORED_KINDS = frozenset(
    {"ConfigMap", "ServiceAccount", "PersistentVolumeClaim", "Service", "NetworkPolicy", "PodMonitor"}
)


def owner() -> str:
    """This test session, as its objects' owner label says it: HOST:PID."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_label() -> list[str]:
    """The label options that mark something as this test session's."""
    return ["--label", f"{OWNER}={owner()}"]


# Per kind, what lists it, its name's key in podman's JSON, and what removes it: containers first, networks last.
ABANDONED_KINDS = [
    (("ps", "--all"), "Names", ("rm", "--force", "--time", "0")),
    (("pod", "ps"), "Name", ("pod", "rm", "-f")),
    (("volume", "ls"), "Name", ("volume", "rm", "--force")),
    (("network", "ls"), "name", ("network", "rm")),
]


def sweep_abandoned(engine: Podman) -> list[str]:
    """Remove what sessions that are no longer running left behind; returns the names removed."""
    removed = []
    for listing, key, remove in ABANDONED_KINDS:
        found = engine(*listing, "--filter", f"label={OWNER}", "--format", "json", check=False).stdout
        for item in json.loads(found or "[]"):
            labels = item.get("Labels") or item.get("labels") or {}
            if _abandoned(labels.get(OWNER, "")):
                name = item[key][0] if isinstance(item[key], list) else item[key]
                if engine(*remove, name, check=False).returncode == 0:  # a pod's infra container goes with the pod
                    removed.append(name)
    return removed


def _abandoned(label: str) -> bool:
    """Whether an owner label names a session of this host that is no longer running."""
    host, _, pid = label.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) <= 0:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Cluster:
    """Objects, names, addresses and pods of one test session's cluster."""

    def __init__(self, engine: Podman, root: Path):
        self.engine, self.root = engine, root
        self.owned = owner_label()
        self.prefix = f"e2e{random.randrange(16**6):06x}"
        self.network = self.prefix
        for _ in range(20):
            subnet = ipaddress.ip_network(f"10.{random.randrange(100, 250)}.{random.randrange(256)}.0/24")
            made = self.engine("network", "create", *self.owned, "--subnet", str(subnet), self.network, check=False)
            if made.returncode == 0:
                break
        else:
            raise AssertionError("no free /24 for the cluster's network")
        self.subnet = subnet
        self.gateway = str(subnet.network_address + 1)
        # netavark makes the bridge (and the gateway's address on this host) for the first container on the
        # network and removes it with the last: an idle pod (its pause container) keeps it for the session.
        self.engine("pod", "create", *self.owned, "--name", f"{self.prefix}-node", "--network", self.network)
        self.engine("pod", "start", f"{self.prefix}-node")
        self.objects: dict[tuple[str, str], dict] = {}
        self.addresses: dict[str, str] = {}  # pod hostname -> IP
        self.names: dict[str, str] = {}  # DNS name -> IP (headless Services, operators' Services)
        self.proxies: dict[int, ServiceProxy] = {}
        self.kubelet = Kubelet(self)
        self.trainer_status = None  # Kubeflow Trainer's TrainJobStatus gate: a controllers.StatusGate when on

    # -- objects -------------------------------------------------------------------------------------
    def apply(self, documents: list[dict]) -> list[dict]:
        """Store the configuration objects; return the workloads (Deployments, Jobs, training jobs, Pods)."""
        workloads = []
        for document in documents:
            kind, name = document["kind"], document["metadata"]["name"]
            if kind in STORED_KINDS:
                self.objects[(kind, name)] = document
                if kind == "Service":
                    self._service(document)
            else:
                workloads.append(document)
        return workloads

    def remove(self, kind: str, name: str) -> None:
        """Delete a configuration object (a kept claim stays: helm.sh/resource-policy: keep)."""
        document = self.objects.pop((kind, name), None)
        if kind == "Service" and document and document["spec"].get("clusterIP") != "None":
            for port in document["spec"]["ports"]:
                self.proxies.pop(int(port["port"])).close()

    def object(self, kind: str, name: str) -> dict:
        found = self.objects.get((kind, name))
        if found is None:
            raise Refused(f"{kind} {name}: not rendered by the release (an object the pod needs)")
        return found

    def service_account_token(self, audience: str) -> str:
        """The token a projected serviceAccountToken volume gets for `audience` (no API server here to issue a
        JWT: the session's prefix and the audience, which the stand-in status server checks)."""
        return f"{self.prefix}.{audience}"

    def claim(self, name: str) -> str:
        """The podman volume behind a PersistentVolumeClaim of the release."""
        self.object("PersistentVolumeClaim", name)
        volume = f"{self.prefix}-{name}"
        if self.engine("volume", "exists", volume, check=False).returncode != 0:
            self.engine("volume", "create", *self.owned, volume)
        return volume

    # -- addresses and names -------------------------------------------------------------------------
    def ip(self, hostname: str) -> str:
        """The pod IP of a hostname: a new one the first time, the same one for its replacements."""
        if hostname not in self.addresses:
            self.addresses[hostname] = str(self.subnet.network_address + 10 + len(self.addresses))
        return self.addresses[hostname]

    def publish(self, name: str, hostname: str) -> str:
        """A DNS name for a pod's hostname (a headless Service's record); returns its IP."""
        self.names[name] = self.ip(hostname)
        return self.names[name]

    def subdomain(self, hostname: str, subdomain: str, labels: dict, service: dict | None = None) -> None:
        """HOSTNAME.SUBDOMAIN for a pod, when a headless Service of that name selects it (as cluster DNS)."""
        service = service or self.objects.get(("Service", subdomain))
        if service and service["spec"].get("clusterIP") == "None" and selects(service["spec"]["selector"], labels):
            self.publish(f"{hostname}.{subdomain}", hostname)

    def hosts(self) -> dict[str, str]:
        """/etc/hosts of a pod started now."""
        services = {
            name: self.gateway
            for (kind, name), document in self.objects.items()
            if kind == "Service" and document["spec"].get("clusterIP") != "None"
        }
        return {**services, **self.names}

    def _service(self, document: dict) -> None:
        spec = document["spec"]
        if spec.get("clusterIP") == "None":
            return
        for port in spec["ports"]:
            if int(port["port"]) in self.proxies:
                raise Refused(f"Service {document['metadata']['name']}: port {port['port']} taken on the gateway")
            self.proxies[int(port["port"])] = ServiceProxy(
                self.gateway, int(port["port"]), lambda s=spec, p=port: self.endpoint(s, p)
            )

    def endpoint(self, spec: dict, port: dict) -> tuple[str, int] | None:
        """A Ready pod the Service selects, at the targetPort (a name resolved in that pod's container)."""
        for pod in list(self.kubelet.pods.values()):
            if pod.phase == "Running" and pod.ready and selects(spec["selector"], pod.labels):
                container = pod.request.spec["containers"][0]
                return pod.ip, container_port(container, port.get("targetPort", port["port"]))
        return None

    # -- running ------------------------------------------------------------------------------------
    def wait(self, done: Callable[[], object], timeout: float, tick: Callable[[], None] | None = None):
        """Poll the pods (and `tick`, a test's fault injector) until `done()` is truthy; a timeout is a hang."""
        deadline = time.monotonic() + timeout
        while True:
            self.kubelet.poll()
            if tick:
                tick()
            result = done()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result within {timeout:.0f} s (a hang?)")
            time.sleep(1)

    def close(self) -> None:
        """Remove every pod, proxy, claim and the network."""
        for pod in list(self.kubelet.pods.values()):
            self.engine("rm", "--force", "--time", "0", pod.container, check=False)
        for proxy in self.proxies.values():
            proxy.close()
        for (kind, name), _ in list(self.objects.items()):
            if kind == "PersistentVolumeClaim":
                self.engine("volume", "rm", "--force", f"{self.prefix}-{name}", check=False)
        self.engine("pod", "rm", "--force", f"{self.prefix}-node", check=False)
        self.engine("network", "rm", "--force", self.network, check=False)


def rendered(values: list[str], release: str) -> list[dict]:
    """The objects tools/render.py renders for a release (as `helm template`: tests/integration/test_chart.py)."""
    return [document for document in yaml.safe_load_all(render(values, release=release)) if document]


class ServiceProxy:
    """kube-proxy's part for one Service port: TCP on the gateway, forwarded to a Ready endpoint (or refused)."""

    def __init__(self, host: str, port: int, endpoint: Callable[[], tuple[str, int] | None]):
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                target = endpoint()
                if target is None:
                    return  # no Ready endpoint: the connection closes, as a Service without endpoints rejects it
                with socket.create_connection(target, timeout=10) as upstream:
                    splice(self.request, upstream)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    a.settimeout(None)
    b.settimeout(None)
    sockets = [a, b]
    while True:
        readable, _, _ = select.select(sockets, [], [], 60)
        if not readable:
            continue
        for source in readable:
            data = source.recv(1 << 16)
            if not data:
                return
            (b if source is a else a).sendall(data)
