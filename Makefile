# aml-hpc. On a fresh clone `make demo` and `make test` install everything they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.PHONY: help bootstrap env env-demo demo test check check-all typecheck build doctor bench bench-bootstrap plan preview up down images new-experiment expired lint clean distclean

STACK ?= dev
ENV ?= dev
DAYS ?= 7
# make's variables are case-sensitive: `make plan stack=prod` would plan dev. The lower-case
# spelling of each variable means the same; given both ways with different values, it stops.
define same_as_upper
ifdef $(2)
ifeq ($$(origin $(1)),command line)
ifneq ($$($(1)),$$($(2)))
$$(error $(1)=$$($(1)) and $(2)=$$($(2)) disagree: give one of them)
endif
else
$(1) := $$($(2))
endif
endif
endef
$(eval $(call same_as_upper,STACK,stack))
$(eval $(call same_as_upper,NAME,name))
$(eval $(call same_as_upper,ENV,env))
$(eval $(call same_as_upper,DAYS,days))
$(eval $(call same_as_upper,CONFIRM,confirm))

PY := .venv/bin/python
# Pulumi state lives in a local folder unless you point PULUMI_BACKEND_URL elsewhere.
export PULUMI_BACKEND_URL ?= file://$(CURDIR)/.pulumi-state
export PULUMI_SKIP_UPDATE_CHECK := true

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

bootstrap: ## install everything: uv, the locked environment with the test tools, PyTorch (CPU here), Azurite
	@scripts/bootstrap.sh --for test

# What a target needs, installed on first use (scripts/bootstrap.sh is idempotent and fast
# once done): env = the project's own dependencies; env-demo = those, PyTorch and Azurite.
env:
	@scripts/bootstrap.sh --for demo --no-node
env-demo:
	@scripts/bootstrap.sh --for demo

demo: env-demo ## the main job, offline: dev plan, cosmoflow rendered, data uploaded, rehearsed on 2 nodes x 2 ranks
	$(PY) -m amlhpc.jobs.local.demo

# The suite's files run in parallel worker processes (pytest-xdist; a file stays on one worker, so
# its module fixtures are built once), longest first (tests/time_box.py). Three workers on 2 CPUs:
# the rehearsals wait on their processes part of the time, and two workers left a fifth of the CPUs
# idle (704 s against 583 s for the parallel part; bench/RESULTS.md "The suite's wall time").
# Tests marked `alone` measure their own CPU cost: they run afterwards, with no neighbour.
# mypy runs beside the parallel part (scripts/run_suite.sh); a type error still fails the target.
TEST_WORKERS ?= 3
test: bootstrap ## the whole test suite with the type check (and the installed wheel's test), TEST_WORKERS=3 in parallel
	@TEST_WORKERS=$(TEST_WORKERS) scripts/run_suite.sh

# `make check` runs in a time box: the tests that name a changed module, cheapest first by the
# times earlier runs recorded, within CHECK_BOX seconds (tests/time_box.py); it names what it left out.
CHECK_BOX ?= 60
CHECK_KEEP = .pytest_cache/check-keep.txt
check: bootstrap ## the edit loop, about 2 minutes: ruff, mypy and the tests of what changed since main that fit CHECK_BOX=60 s
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" --keep-file $(CHECK_KEEP) \
		$$($(PY) scripts/changed_tests.py --time-box $(CHECK_BOX) --workers $(TEST_WORKERS) --keep-file $(CHECK_KEEP))

check-all: bootstrap ## ruff, mypy and every test that names a module changed since main (no time box)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $$($(PY) scripts/changed_tests.py)

typecheck: bootstrap ## mypy: strict on the fully typed modules, the baseline for the rest (pyproject.toml)
	$(PY) -m mypy

UV = $(shell command -v uv 2>/dev/null || echo .bootstrap/bin/uv)
build: bootstrap ## the release in dist/: wheel, sdist and constraints.txt (the locked versions, for pip)
	$(UV) build --out-dir dist
	$(UV) export --frozen --no-dev --all-extras --no-emit-project --no-hashes --no-header -q -o dist/constraints.txt

doctor: env ## check what the first deploy and submit of STACK need (Azure sign-in, Pulumi, providers, roles, quota)
	$(PY) -m amlhpc doctor --stack $(STACK)

plan: env ## offline plan of STACK (no Azure, no Pulumi CLI)
	$(PY) -m amlhpc.infra plan --stack $(STACK)

BENCH_OUT := bench/out
bench: env-demo ## benchmarks; results in bench/out/ (UPDATE_RESULTS=1: also rewrite the tracked bench/RESULTS.md)
	@mkdir -p $(BENCH_OUT)
	$(PY) -m bench.staging --out $(BENCH_OUT)$(if $(UPDATE_RESULTS), --update-results)
	$(PY) -m bench.inflate --out $(BENCH_OUT)
	$(PY) -m bench.checkpoint --out $(BENCH_OUT)$(if $(UPDATE_RESULTS), --update-results)
	$(PY) -m amlhpc.infra.plan.bench | tee $(BENCH_OUT)/plan.txt
	$(PY) -m bench.recovery --out $(BENCH_OUT)$(if $(UPDATE_RESULTS), --update-results)

bench-bootstrap: ## time a fresh clone's first `make demo` and `make test` install step (writes bench/out/bootstrap.md)
	@scripts/time-fresh-clone.sh $(BENCH_OUT)/bootstrap.md

lint: bootstrap ## ruff and the image checks (pins, Dockerfiles, hadolint)
	$(PY) -m ruff check .
	$(PY) -m amlhpc.images check

images: env ## build the training images missing from STACK's registry (az acr build); print their refs
	$(PY) -m amlhpc.images build --stack $(STACK)

preview: env ## pulumi preview STACK against Azure, policy pack on (needs the Pulumi CLI and az login)
	@scripts/pulumi-stack.sh preview $(STACK)

up: env ## pulumi up STACK, policy pack on
	@scripts/pulumi-stack.sh up $(STACK)

down: env ## destroy STACK (environments need CONFIRM=STACK; experiments are also removed)
	@CONFIRM=$(CONFIRM) scripts/pulumi-stack.sh down $(STACK)

new-experiment: env ## write Pulumi.exp-NAME.yaml: make new-experiment NAME=x ENV=dev DAYS=7
	$(PY) -m amlhpc.infra new-experiment "$(NAME)" --env $(ENV) --days $(DAYS)

expired: env ## experiment stacks past their expiresAt
	$(PY) -m amlhpc.infra expired

clean: ## remove what the tools create: .rehearsal/ .scratch/ .azurite/ bench/out/ dist/ and caches (keeps .venv, node_modules, .pulumi-state)
	rm -rf .rehearsal .scratch .azurite $(BENCH_OUT) dist .pytest_cache .ruff_cache .mypy_cache
	find . \( -path ./.venv -o -path ./node_modules -o -path ./.git -o -path ./.bootstrap \) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## clean, and the installed environments too (.venv, .bootstrap, node_modules)
	rm -rf .venv .bootstrap node_modules
