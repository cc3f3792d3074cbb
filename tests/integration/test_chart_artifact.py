"""The chart as a signed OCI artifact: `make chart-push` packages the chart, signs it (Helm provenance, a throwaway
GPG key made here) and pushes it to Debian's docker-registry on 127.0.0.1 over TLS (tests/imagebuild.py's
LocalRegistry); pulled back by its digest it verifies against the key and renders the same objects as the
checkout's chart. With Helm 4 and Helm 3.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from imagebuild import LocalRegistry, registry_missing

from conftest import REPO

CHART = REPO / "helm" / "imagenet-train"
TOOLS = REPO / ".tools" / "bin"
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.values.yaml"))
API_VERSIONS = [
    "kubeflow.org/v1/PyTorchJob",
    "trainer.kubeflow.org/v1alpha1/TrainJob",
    "jobset.x-k8s.io/v1alpha2/JobSet",
    "ais.nvidia.com/v1beta1/AIStore",
]
CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
PROVENANCE_LAYER = "application/vnd.cncf.helm.chart.provenance.v1.prov"
# Helm 3 resolves registries through containerd's resolver, which speaks plain HTTP to every loopback address
# (helm/helm#11683), so its leg reaches the same 127.0.0.1 registry by this name, mapped by an /etc/hosts of its
# own in a private mount namespace: TLS is verified against the name, which the registry's certificate carries.
REGISTRY_NAME = "chart-registry.test"


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make k8s-tools` (make test does)")
    return str(path)


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])


@dataclass
class SigningKey:
    """A GPG key made for one test: its user id, Helm's legacy keyrings and its fingerprint."""

    name: str
    secret_keyring: Path
    public_keyring: Path
    fingerprint: str


def signing_key(folder: Path, name: str) -> SigningKey:
    """A passphrase-less key in GNUPGHOME=folder/gnupg, exported as the legacy keyrings Helm reads."""
    home = folder / "gnupg"
    home.mkdir(parents=True, mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> bytes:
        return subprocess.run(["gpg", "--batch", *args], env=env, capture_output=True, check=True, timeout=120).stdout

    gpg("--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", "default", "default", "never")
    secret, public = folder / "secring.gpg", folder / "pubring.gpg"
    secret.write_bytes(gpg("--export-secret-keys", name))
    public.write_bytes(gpg("--export", name))
    listing = gpg("--with-colons", "--list-keys", name).decode()
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True, timeout=60)  # gpg's agent
    return SigningKey(name, secret, public, fingerprint)


@pytest.fixture
def helm_env(tmp_path, monkeypatch) -> None:
    """Helm's cache, config (registry logins) and data in tmp_path, never the user's."""
    for variable in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(variable, str(tmp_path / "helm-home" / variable.lower()))


# A make of its own, as a person runs it: under `make test` the parent's variables would make it print
# "make[1]: ..." where a person sees "make: ...".
ALONE = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


def run(*command: str | Path, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, *map(str, command)], capture_output=True, text=True, timeout=300, env=ALONE)


def make_chart_push(helm: str, registry: str, key: SigningKey, out: Path, *flags: str, wrap=()):
    """`make chart-push` as docs/development.md gives it, its output and digest file in `out`."""
    variables = [f"HELM={helm}", f"CHART_REGISTRY={registry}", f"CHART_KEY={key.name}"]
    variables += [f"CHART_KEYRING={key.secret_keyring}", f"CHART_OUT={out}", f"CHART_DIGEST_FILE={out / 'digest'}"]
    variables += [f"CHART_PUSH_FLAGS={' '.join(flags)}"] if flags else []
    return run("make", "--no-print-directory", "-C", REPO, "chart-push", *variables, wrap=wrap)


def objects(helm: str, chart: Path | str, values: Path, *flags: str | Path, wrap: tuple[str, ...] = ()) -> list[dict]:
    """The objects `helm template` renders from `chart` (a folder, a package or an oci:// reference) with `values`."""
    api = [arg for version in API_VERSIONS for arg in ("--api-versions", version)]
    command = [helm, "template", "imagenet", chart, "-f", values, "--kube-version", "1.33.0", *api, *flags]
    rendered = run(*command, wrap=wrap)
    assert rendered.returncode == 0, rendered.stderr
    return [document for document in yaml.safe_load_all(rendered.stdout) if document]


def private_hosts(tmp_path: Path) -> tuple[str, ...]:
    """A command prefix that runs the command with REGISTRY_NAME mapped to 127.0.0.1 (a mount namespace)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("Helm 3 needs a non-loopback name for a TLS registry: this needs root and unshare")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost {REGISTRY_NAME}\n")
    return ("unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts))


@pytest.mark.parametrize("helm_name", ["helm", "helm3"])
def test_make_chart_push_sends_a_signed_chart_that_pulled_by_digest_verifies_and_renders_the_checkouts_objects(
    helm_name, tmp_path, helm_env
):
    reason = registry_missing()
    if reason:
        pytest.skip(reason)
    helm, version = tool(helm_name), chart_version()
    wrap = private_hosts(tmp_path) if helm_name == "helm3" else ()
    key = signing_key(tmp_path / "key", "ops-chart-oci")
    with LocalRegistry(tmp_path / "registry", names=(REGISTRY_NAME,)) as registry:
        host = registry.host if not wrap else registry.host.replace("127.0.0.1", REGISTRY_NAME)
        url, ca = f"oci://{host}/charts", str(registry.cert_dir / "ca.crt")
        push = make_chart_push(helm, url, key, tmp_path / "out", "--ca-file", ca, wrap=wrap)
        assert push.returncode == 0, push.stdout[-3000:] + push.stderr[-3000:]
        digest = (tmp_path / "out" / "digest").read_text().strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
        assert f"pushed {url}/imagenet-train@{digest} (version {version})" in push.stdout
        # Chart.yaml names the release key (a placeholder until a release): a throwaway key is not it.
        assert f"does not name the signing key {key.fingerprint}; Artifact Hub cannot check it" in push.stderr

        # The registry stored a manifest hashing to the digest: the chart and its provenance, as two layers.
        manifest = registry.manifest("charts/imagenet-train", digest)
        assert "sha256:" + hashlib.sha256(manifest).hexdigest() == digest
        assert sorted(layer["mediaType"] for layer in json.loads(manifest)["layers"]) == [CHART_LAYER, PROVENANCE_LAYER]

        pulled = tmp_path / "pulled"
        pulled.mkdir()
        pull = run(helm, "pull", f"{url}/imagenet-train@{digest}", "--prov", "--ca-file", ca, "-d", pulled, wrap=wrap)
        assert pull.returncode == 0 and f"Digest: {digest}" in pull.stderr + pull.stdout, pull.stderr
        by_version = tmp_path / "by-version"
        by_version.mkdir()
        verified_pull = run(
            helm, "pull", f"{url}/imagenet-train", "--version", version, "--verify", "--keyring", key.public_keyring,
            "--ca-file", ca, "-d", by_version, wrap=wrap,
        )  # fmt: skip
        assert verified_pull.returncode == 0, verified_pull.stderr
        assert f"Using Key With Fingerprint: {key.fingerprint}" in verified_pull.stdout
        # As docs/kubernetes.md installs it: by version, --verify against the public keyring.
        installed = objects(
            helm, f"{url}/imagenet-train", EXAMPLES[0], "--version", version, "--verify", "--keyring",
            key.public_keyring, "--ca-file", ca, wrap=wrap,
        )  # fmt: skip
        assert installed == objects(helm, CHART, EXAMPLES[0])
    assert registry.process.poll() is not None  # stopped by its PID

    # Helm names a chart pulled by digest NAME@sha256-HEX.tgz, a name its provenance does not sign, so `pull --verify`
    # by digest fails on the name (as in helm/helm#32546): the pair is verified under the name it was signed as.
    (archive,), (provenance,) = pulled.glob("*.tgz"), pulled.glob("*.tgz.prov")
    signed = tmp_path / "signed" / f"imagenet-train-{version}.tgz"
    signed.parent.mkdir()
    shutil.copy(archive, signed)
    shutil.copy(provenance, f"{signed}.prov")
    verify = run(helm, "verify", "--keyring", key.public_keyring, signed)
    assert verify.returncode == 0, verify.stderr
    assert f"Using Key With Fingerprint: {key.fingerprint}" in verify.stdout
    pushed = (tmp_path / "out" / signed.name).read_bytes()
    assert signed.read_bytes() == (by_version / signed.name).read_bytes() == pushed

    for values in EXAMPLES:
        from_registry = objects(helm, signed, values)
        assert from_registry == objects(helm, CHART, values), values.name
        assert any(obj["kind"] in {"PyTorchJob", "Job", "JobSet", "TrainJob"} for obj in from_registry), values.name


def test_make_chart_push_signs_what_only_its_key_verifies_and_a_changed_byte_fails(tmp_path, helm_env):
    """No registry: the push to a closed port fails after `helm package --sign` and `helm verify` ran."""
    key = signing_key(tmp_path / "key", "ops-chart-oci")
    stranger = signing_key(tmp_path / "stranger", "someone-else")
    push = make_chart_push(tool("helm"), "oci://127.0.0.1:1/charts", key, tmp_path / "out")
    assert push.returncode != 0 and "connection refused" in push.stdout + push.stderr, push.stderr
    assert "pushed" not in push.stdout and not (tmp_path / "out" / "digest").exists()
    package = tmp_path / "out" / f"imagenet-train-{chart_version()}.tgz"
    tampered = tmp_path / "tampered" / package.name
    tampered.parent.mkdir()
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(data)
    shutil.copy(f"{package}.prov", f"{tampered}.prov")
    for helm in (tool("helm"), tool("helm3")):
        good = run(helm, "verify", "--keyring", key.public_keyring, package)
        assert good.returncode == 0 and f"Using Key With Fingerprint: {key.fingerprint}" in good.stdout, good.stderr
        other = run(helm, "verify", "--keyring", stranger.public_keyring, package)
        assert other.returncode != 0 and "unknown entity" in other.stderr, other.stderr
        changed = run(helm, "verify", "--keyring", key.public_keyring, tampered)
        assert changed.returncode != 0 and "sha256 sum does not match" in changed.stderr, changed.stderr


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ([], "CHART_REGISTRY=''; expected an oci:// URL"),
        (["CHART_REGISTRY=https://ghcr.io/acme/charts"], "CHART_REGISTRY='https://ghcr.io/acme/charts'; expected"),
        (["CHART_REGISTRY=oci://ghcr.io/acme/charts"], "CHART_KEY='' CHART_KEYRING=''; expected a key name"),
        (
            ["CHART_REGISTRY=oci://ghcr.io/acme/charts", "CHART_KEY=k", "CHART_KEYRING=/nonexistent/secring.gpg"],
            "CHART_KEYRING='/nonexistent/secring.gpg'; expected",
        ),
        (
            [
                "CHART_REGISTRY=oci://ghcr.io/acme/charts",
                "CHART_KEY=k",
                f"CHART_KEYRING={REPO / 'Makefile'}",
                "HELM=/nonexistent",
            ],
            "HELM=/nonexistent is not an executable",
        ),
    ],
    ids=["no-registry", "not-oci", "no-key", "no-keyring", "no-helm"],
)
def test_make_chart_push_refuses_a_missing_setting_in_one_line_before_packaging(variables, says, tmp_path):
    result = run("make", "--no-print-directory", "-C", REPO, "chart-push", f"CHART_OUT={tmp_path / 'out'}", *variables)
    assert result.returncode == 2
    first, *rest = result.stderr.splitlines()
    assert first.startswith("make chart-push: ") and says in first, result.stderr
    assert all(line.startswith("make: ***") for line in rest), result.stderr
    assert not (tmp_path / "out").exists()
