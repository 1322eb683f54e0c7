"""The text of plans and plan diffs at 80 columns: no line wider unless it is one word or a
raw JSON value, no word split across lines, no two resources that look alike, grouped by
component, the same bytes whatever the terminal."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.bench import write_stack
from amlhpc.infra.plan.details import details
from amlhpc.infra.plan.diff import diff
from amlhpc.infra.plan.mocks import qualified_name
from amlhpc.infra.plan.render import render, short_type
from amlhpc.infra.plan.render_diff import render_markdown, render_text
from amlhpc.infra.plan.text import WIDTH
from tests.plan_helpers import SWEEP_EXPERIMENT

EXPERIMENT = SWEEP_EXPERIMENT
RAW_VALUE = re.compile(r"^\s+[-+] (.*)$")


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("stacks")
    for stack in ("dev", "prod"):
        (root / f"Pulumi.{stack}.yaml").write_text((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
    (root / "Pulumi.exp-sweep.yaml").write_text(yaml.safe_dump({"config": EXPERIMENT}))
    bench = write_stack(root, 10)
    return {stack: evaluate(stack, root) for stack in ("dev", "prod", "exp-sweep", bench)}


def check_width(text: str) -> None:
    for line in text.splitlines():
        if len(line) <= WIDTH:
            continue
        raw = RAW_VALUE.match(line)
        if raw:
            json.loads(raw.group(1))  # a value printed whole, never re-wrapped
            continue
        assert " " not in line.strip(), f"{len(line)} columns and breakable: {line!r}"


@pytest.mark.parametrize("stack", ["dev", "prod", "exp-sweep", "bench"])
def test_plan_fits_80_columns_without_splitting_words(plans, stack):
    plan = plans[stack]
    text = render(plan)
    check_width(text)
    words = set(text.split())
    for r in plan.custom_resources():
        assert qualified_name(r.type, r.inputs, r.name) in words and short_type(r.type) in words
        missing = [w for w in details(r).split() if w not in words and w.rstrip(",") not in words]
        assert not missing, f"{r.name}: split or lost words {missing}"


@pytest.mark.parametrize("stack", ["dev", "prod", "exp-sweep", "bench"])
def test_no_two_resources_look_alike(plans, stack):
    plan = plans[stack]
    rows = [(r.type, qualified_name(r.type, r.inputs, r.name)) for r in plan.custom_resources()]
    assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)


def test_grouped_by_component(plans):
    """Each Azure resource is listed in the block of the component that declares it."""
    plan = plans["prod"]
    blocks: dict[str, list[str]] = {}
    current = None
    for line in render(plan).splitlines():
        if line and not line.startswith(" "):
            current = blocks.setdefault(line, [])
        elif current is not None:
            current.append(line)
    custom = [r for r in plan.resources if r.custom]
    components = [name for name, _, members in plan.by_component() if members]
    assert f"Resources: {len(custom)} in Azure, in {len(components)} components" in blocks
    assert len(custom) > 40 and len(components) > 10
    for name, head, members in plan.by_component():
        block = "\n".join(blocks[f"{name} ({head.type})"]).split()
        for r in members:
            assert qualified_name(r.type, r.inputs, r.name) in block, (name, r.name)


def test_experiment_names_its_environment(plans):
    text = render(plans["exp-sweep"])
    assert "Reads environment dev's published outputs (published/outputs.json beside its" in text


def test_same_text_whatever_the_terminal(plans, monkeypatch):
    first = render(plans["dev"])
    monkeypatch.setenv("COLUMNS", "33")
    assert render(plans["dev"]) == first


def test_diff_fits_80_columns(plans, tmp_path):
    base = plans["prod"].to_json()
    cfg = yaml.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())["config"]
    cfg["aml-hpc:clusters"][0]["sku"] = "Standard_ND96asr_v4"
    cfg["aml-hpc:clusters"].append({"name": "nd-more", "sku": "Standard_ND96amsr_A100_v4", "maxNodes": 2})
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": cfg}))
    head = evaluate("prod", Path(tmp_path)).to_json()
    removed = copy.deepcopy(base)
    removed["resources"] = [r for r in removed["resources"] if r["name"] != "data-account"]
    for before, after in ((base, head), (base, removed), (head, base)):
        result = diff(before, after, "main (0123456)", "Pulumi.prod.yaml in the working tree")
        text = render_text(result)
        check_width(text)
        section = render_markdown(result)
        check_width(section.split("```diff\n", 1)[1])
        assert text.count("\n! ") + text.count("\n+ ") + text.count("\n- ") + text.count("\n~ ") == len(result.resources)
