"""The plan's cost lines never pass an unpriced size off as a saving, and say which region's
prices they use when it is not the stack's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.diff import diff
from amlhpc.infra.plan.render import render
from amlhpc.infra.plan.render_diff import headline, render_markdown, render_text

# UNPRICED: the size the unpriced_size fixture strips of its price
from tests.conftest import UNPRICED_SIZE as UNPRICED


def config(stack: str) -> dict:
    return yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def plan_of(tmp_path: Path, cfg: dict, stack: str) -> dict:
    folder = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": cfg}))
    return evaluate(stack, folder).to_json()


@pytest.fixture(scope="module")
def prod() -> dict:
    return evaluate("prod").to_json()


class TestUnpricedSizes:
    def switched(self, tmp_path, prod, unpriced_size):
        cfg = config("prod")
        cfg["aml-hpc:clusters"][0]["sku"] = UNPRICED
        cfg["aml-hpc:clusters"][0]["allowUnlistedRegion"] = True
        return diff(prod, plan_of(tmp_path, cfg, "prod"), "base", "head")

    def test_switching_to_an_unpriced_size_is_not_a_negative_delta(self, tmp_path, prod, unpriced_size):
        result = self.switched(tmp_path, prod, unpriced_size)
        text = render_text(result) + render_markdown(result) + headline(result)
        assert "-$" not in text
        assert "unpriced" in text and UNPRICED in text
        assert "aml-hpc:prices." in text  # the fix: set a price for it
        full = result.cost[0]
        assert full.unpriced and full.change is None  # no number pretends to be the change

    def test_an_unpriced_cluster_is_never_a_zero_cost_line(self, tmp_path, unpriced_size):
        cfg = config("prod")
        cfg["aml-hpc:clusters"][0]["sku"] = UNPRICED
        cfg["aml-hpc:clusters"][0]["allowUnlistedRegion"] = True
        folder = tmp_path / "one"
        folder.mkdir()
        (folder / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": cfg}))
        text = render(evaluate("prod", folder))
        line = next(line for line in text.splitlines() if line.startswith("Full scale:"))
        assert "unpriced" in text.split("Full scale:")[1].split("\n\n")[0] and "at least" in line
        assert "$0.00/hour at full scale" not in text


class TestPriceRegion:
    def test_a_stack_priced_from_another_regions_rows_says_so(self):
        plan = evaluate("dev")  # swedencentral; the catalog's rows are eastus prices
        assert plan.config.location == "swedencentral"
        text = render(plan)
        cost = text.split("GPU cost")[1].split("GPU quota")[0]
        assert "eastus prices, not swedencentral" in " ".join(cost.split())
        document = plan.to_json()["cost"]
        assert document["location"] == "swedencentral" and document["priceRegions"] == ["eastus"]

    def test_a_stack_in_the_price_region_has_no_such_note(self):
        plan = evaluate("prod")  # eastus
        assert "prices, not" not in render(plan)
