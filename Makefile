# aml-hpc. On a fresh clone `make demo` and `make test` install everything they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.PHONY: help bootstrap demo test bench plan preview up down images new-experiment expired lint clean

STACK ?= dev
PY := .venv/bin/python
# Pulumi state lives in a local folder unless you point PULUMI_BACKEND_URL elsewhere.
export PULUMI_BACKEND_URL ?= file://$(CURDIR)/.pulumi-state
export PULUMI_SKIP_UPDATE_CHECK := true

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

bootstrap: ## install uv, the locked environment, PyTorch (CPU here) and Azurite
	@scripts/bootstrap.sh

demo: bootstrap ## the main job, offline: dev plan, cosmoflow rendered, data uploaded, rehearsed on 2 nodes x 2 ranks
	$(PY) -m jobs.local.demo

test: bootstrap ## the whole test suite
	$(PY) -m pytest

plan: bootstrap ## offline plan of STACK (no Azure, no Pulumi CLI)
	$(PY) -m infra plan --stack $(STACK)

bench: bootstrap ## staging vs naive and each stage alone against Azurite (writes bench/RESULTS.md); offline plan timing
	$(PY) -m bench.staging
	$(PY) -m infra.plan.bench

lint: bootstrap ## ruff and the image checks (pins, Dockerfiles, hadolint)
	$(PY) -m ruff check infra jobs images tests
	$(PY) -m images check

images: bootstrap ## build the training images missing from STACK's registry (az acr build); print their refs
	$(PY) -m images build --stack $(STACK)

preview: bootstrap ## pulumi preview STACK against Azure, policy pack on (needs the Pulumi CLI and az login)
	@scripts/pulumi-stack.sh preview $(STACK)

up: bootstrap ## pulumi up STACK, policy pack on
	@scripts/pulumi-stack.sh up $(STACK)

down: bootstrap ## destroy STACK (environments need CONFIRM=STACK; experiments are also removed)
	@CONFIRM=$(CONFIRM) scripts/pulumi-stack.sh down $(STACK)

ENV ?= dev
DAYS ?= 7
new-experiment: bootstrap ## write Pulumi.exp-NAME.yaml: make new-experiment NAME=x ENV=dev DAYS=7
	$(PY) -m infra new-experiment "$(NAME)" --env $(ENV) --days $(DAYS)

expired: bootstrap ## experiment stacks past their expiresAt
	$(PY) -m infra expired
