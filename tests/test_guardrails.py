"""Guardrails against absurd input: a cluster that would spend the month's budget within an
hour, a YAML key written twice, goodput rates that make no sense, OS errors (shutil's too)
as one line with the right verb, and no temporary file left behind by a failed write. Each
case asserts the message a user reads."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.core import atomic
from amlhpc.core import goodput as model
from amlhpc.core.errors import UserError, os_error_line
from amlhpc.infra.config import parse, read_stack_file
from amlhpc.jobs.plan import goodput
from tests.jobs_helpers import outputs_file

REPO = Path(__file__).resolve().parent.parent
BASE = {"azure-native:location": "swedencentral", "aml-hpc:owner": "team@example.com",
        "aml-hpc:budget": {"monthlyAmountUsd": 3000, "alertEmails": ["team@example.com"]}}


def cluster(nodes: int, sku: str = "Standard_ND96asr_v4") -> dict:
    return {**BASE, "aml-hpc:clusters": [{"name": "nd-a100", "sku": sku, "maxNodes": nodes, "priority": "LowPriority"}]}


class TestFullScaleCostAgainstTheBudget:
    def test_a_cluster_that_spends_the_month_in_minutes_is_refused_with_the_numbers_and_both_fixes(self):
        with pytest.raises(UserError) as refused:
            parse("dev", cluster(5000), "Pulumi.dev.yaml")
        (problem,) = refused.value.problems
        assert problem.path == "aml-hpc:clusters[0].maxNodes"
        assert "5,000 x Standard_ND96asr_v4 at $27.20/node-hour" in problem.message
        assert "$135,985 an hour at full scale" in problem.message and "would be gone in 1.3 minutes" in problem.message
        assert "within 1 hour at full scale is refused" in problem.message
        assert "lower maxNodes to 110 or fewer" in problem.hint and "monthlyAmountUsd' 135985" in problem.hint

    def test_the_issue_s_hundred_million_nodes_are_out_of_range(self):
        with pytest.raises(UserError) as refused:
            parse("dev", cluster(100_000_000), "Pulumi.dev.yaml")
        assert "100000000 is out of range; nodes must be a whole number >= 1 and <= 10000" in refused.value.render()

    def test_a_cluster_inside_the_rule_and_the_shipped_stacks_pass(self):
        assert parse("dev", cluster(110), "Pulumi.dev.yaml").clusters[0].max_nodes == 110
        from amlhpc.infra.config import load_stack_config

        for stack in ("dev", "prod"):
            load_stack_config(stack)

    def test_a_stack_price_override_is_what_counts(self):
        with pytest.raises(UserError):
            parse("dev", {**cluster(10), "aml-hpc:prices": {"Standard_ND96asr_v4": 400}}, "Pulumi.dev.yaml")


class TestDuplicateKeys:
    def test_a_stack_file_names_both_lines(self, tmp_path):
        (tmp_path / "Pulumi.dev.yaml").write_text(
            "config:\n  azure-native:location: eastus\n  aml-hpc:clusters:\n    - name: gpu\n      maxNodes: 2\n"
            "      sku: Standard_ND96asr_v4\n      maxNodes: 200\n")
        with pytest.raises(UserError) as refused:
            read_stack_file("dev", tmp_path)
        text = refused.value.render()
        assert "Pulumi.dev.yaml: line 7, column 7: duplicate key 'maxNodes': on line 5 and again on line 7" in text
        assert "keep one of the two (YAML would silently use the last one)" in text

    def test_a_recipe_names_both_lines(self, tmp_path):
        from amlhpc.jobs import recipes

        source = (REPO / "amlhpc" / "jobs" / "recipes" / "cosmoflow.yaml").read_text()
        path = tmp_path / "mine.yaml"
        path.write_text(source + "nodes: 64\n")
        line = len(source.splitlines()) + 1
        first = next(i for i, text in enumerate(source.splitlines(), 1) if text.startswith("nodes:"))
        with pytest.raises(UserError) as refused:
            recipes.load(str(path))
        assert f"duplicate key 'nodes': on line {first} and again on line {line}" in refused.value.render()

    def test_equal_keys_in_different_mappings_and_merge_keys_are_fine(self):
        from amlhpc.core import yamlfile

        assert yamlfile.load("a: {name: x}\nb: {name: y}\n") == {"a": {"name": "x"}, "b": {"name": "y"}}
        assert yamlfile.load("a: &d {k: 1}\nb:\n  <<: *d\n  j: 2\n")["b"] == {"k": 1, "j": 2}


def estimate(*args: str):
    from amlhpc.jobs.cli.main import app

    return CliRunner().invoke(app, ["estimate", "cosmoflow", "--stack", "dev", "--outputs", str(outputs_file("dev")),
                                    *args], env={"COLUMNS": "200"})


class TestGoodputRates:
    @pytest.mark.parametrize("flag, value, says", [
        ("--preemption-rate", "5", "5.0 is out of range; interruptions per node-hour must be a finite number >= 0 and < 1"),
        ("--preemption-rate", "1", "interruptions per node-hour must be a finite number >= 0 and < 1"),
        ("--preemption-rate", "inf", "is not a finite number"),
        ("--failure-rate", "nan", "is not a finite number; interruptions per GPU-hour"),
        ("--checkpoint-gb", "0", "GB per checkpoint must be a finite number > 0"),
    ])
    def test_nonsense_rates_are_refused_with_the_range(self, flag, value, says):
        result = estimate(flag, value)
        words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # typer's error panel, unwrapped
        assert result.exit_code == 2 and says in words, result.output

    def test_json_has_the_goodput_and_every_number_is_finite(self):
        result = estimate("--preemption-rate", "0.05", "--json")  # dev's nd-a100 is LowPriority
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout, parse_constant=refuse_constant)  # no Infinity, -Infinity or NaN
        good = document["goodput"]
        assert good["inputs"]["preemptionsPerNodeHour"] == 0.05 and 0 < good["goodput"] < 1 and good["finishes"] is True
        assert good["wallHours"] > good["usefulHours"] == document["hours"] and good["usdPerUsefulHour"] > 0
        assert "inf" not in result.stdout.lower() and "nan" not in result.stdout.lower()

    def test_a_job_that_never_finishes_says_so_in_finite_words(self):
        inputs = model.Inputs(nodes=64, gpus_per_node=8, state_gb=1, upload_gbps=10, restore_gbps=50, blob_interval_s=600,
                              preemptions_per_node_hour=0.9)
        plan = model.make(inputs)
        lines = goodput.describe(plan, size_source="given", priority="LowPriority", hours=12, usd_per_node_hour=27.2)
        text = "\n".join(lines)
        assert plan.goodput_recipe < goodput.NO_USEFUL_WORK and "no useful work" in text and "never finishes" in text
        assert "inf" not in text and "nan" not in text and "per useful hour" not in text
        document = goodput.document(plan, size_source="given", hours=12, usd_per_node_hour=27.2)
        assert document["finishes"] is False and document["wallHours"] is None and document["usdPerUsefulHour"] is None
        json.dumps(document, allow_nan=False)

    def test_failures_faster_than_any_recovery_are_zero_goodput_not_an_overflow(self):
        inputs = model.Inputs(nodes=1000, gpus_per_node=8, state_gb=1000, upload_gbps=10, restore_gbps=50,
                              blob_interval_s=600, failures_per_gpu_hour=0.9)  # e^(2 per s x 1,000 s) overflows a float
        plan = model.make(inputs)
        assert plan.goodput == 0 and plan.goodput_recipe == 0
        text = "\n".join(goodput.describe(plan, size_source="given", priority="Dedicated", hours=5, usd_per_node_hour=1))
        assert "never finishes" in text and "inf" not in text and "nan" not in text
        json.dumps(goodput.document(plan, size_source="given", hours=5, usd_per_node_hour=1), allow_nan=False)

    def test_no_interruption_is_none_expected_not_infinity(self):
        inputs = model.Inputs(nodes=1, gpus_per_node=8, state_gb=1, upload_gbps=10, restore_gbps=50, blob_interval_s=600,
                              failures_per_gpu_hour=0)
        plan = model.make(inputs)
        text = "\n".join(goodput.describe(plan, size_source="given", priority="Dedicated", hours=1, usd_per_node_hour=1))
        assert "failures on 1 x 8 GPUs: none expected" in text and "inf" not in text and "nan" not in text
        assert plan.goodput == plan.goodput_recipe == 1.0
        document = goodput.document(plan, size_source="given", hours=1, usd_per_node_hour=1)
        assert document["mtbiHours"] is None and document["nodeIntervalS"] is None and document["finishes"] is True
        assert document["wallHours"] == 1 and document["expectedFailures"] == 0
        json.dumps(document, allow_nan=False)


def refuse_constant(name: str):
    raise AssertionError(f"{name} in JSON: every number must be finite")


class TestOsErrors:
    def test_a_copytree_failure_is_one_line_with_the_count(self):
        failures = [(f"src/f{i}", f".rehearsal/r/node0/amlhpc/jobs/f{i}",
                     f"[Errno 28] No space left on device: '.rehearsal/r/node0/amlhpc/jobs/f{i}'") for i in range(400)]
        line = os_error_line(shutil.Error(failures))
        assert line.startswith("no space left on the device holding .rehearsal/r/node0/amlhpc/jobs/f0 "
                               "(and 399 more file(s) like it): fix: free some space")
        assert "\n" not in line and len(line) < 300

    def test_an_unreadable_file_is_called_unreadable(self, tmp_path, monkeypatch):
        secret = tmp_path / "data" / "part-0.bin"
        secret.parent.mkdir()
        secret.write_bytes(b"x")
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == secret else real(p, mode))  # root reads all
        line = os_error_line(PermissionError(errno.EACCES, "Permission denied", str(secret)))
        assert line.startswith(f"cannot read {secret}: permission denied: fix: make it readable")
        assert "cannot write" not in line
        copied = shutil.Error([(str(secret), str(tmp_path / "out" / "part-0.bin"),
                                f"[Errno 13] Permission denied: '{secret}'")])
        assert os_error_line(copied).startswith("cannot read")

    def test_a_folder_that_cannot_take_a_file_is_still_cannot_write(self, tmp_path):
        line = os_error_line(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "new" / "file")))
        assert line.startswith("cannot write")


class TestNothingLeftBehind:
    def test_a_snapshot_that_fails_halfway_leaves_no_tmp_folder(self, tmp_path, monkeypatch):
        from amlhpc.jobs.plan import build

        calls = []

        def full(src, dst, *args, **kwargs):
            calls.append(src)
            if len(calls) > 3:
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
            return shutil.copy(src, dst)

        monkeypatch.setattr(shutil, "copy2", full)
        with pytest.raises(OSError, match="No space"):
            build.snapshot(("amlhpc/jobs/runtime",), dest_root=tmp_path)
        assert list(tmp_path.iterdir()) == []

    def test_a_report_that_fails_to_write_leaves_no_tmp_file(self, tmp_path, monkeypatch):
        from amlhpc.jobs import report

        recorded = REPO / "tests" / "fixtures" / "runs" / "cosmoflow-recorded"

        def full(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))

        monkeypatch.setattr(Path, "replace", full)
        with pytest.raises(OSError):
            report.write(recorded, tmp_path / "report.html")
        assert list(tmp_path.iterdir()) == []

    def test_a_folder_made_concurrently_is_kept(self, tmp_path):
        dest = tmp_path / "snap"
        with atomic.new_folder(dest) as tmp:
            dest.mkdir()  # another process won the race
            (tmp / "x").write_text("same")
        assert dest.is_dir() and [p.name for p in tmp_path.iterdir()] == ["snap"]


def test_the_shipped_stack_files_have_no_duplicate_keys():
    from amlhpc.core import yamlfile

    for path in sorted(REPO.glob("Pulumi*.yaml")):
        assert isinstance(yamlfile.load(path.read_text()), dict), path
    assert yaml  # the loader is PyYAML's
