"""amlhpc.core.values: every number a person types is finite and sane, and a run name is a plain name.

Each case is the input a user could give (a flag, a recipe key, a stack key) and the refusal
it must get: a clear error naming the value and the range, exit 2, no traceback, nothing
computed from the bad value (no `$nan`, no OverflowError, no `Infinity` in JSON).
"""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from amlhpc.core import values
from amlhpc.jobs.cli import main as cli
from tests.jobs_helpers import outputs_file

runner = CliRunner()


def run(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


class TestCheckNumber:
    @pytest.mark.parametrize("given", [math.nan, math.inf, -math.inf, "nan", "inf", "1e400", "-inf"])
    def test_non_finite_values_are_refused_with_the_value_named(self, given):
        with pytest.raises(values.NumberError, match=r"not a finite number; hours must be a finite number > 0"):
            values.check_number(given, "hours")

    @pytest.mark.parametrize("given, kind", [(0, "hours"), (-1, "usd"), (10_000.5, "usd_per_hour"),
                                             (1e16, "params"), (5000, "gpu_gib"), (0, "gpus")])
    def test_out_of_range_values_are_refused_with_the_range(self, given, kind):
        with pytest.raises(values.NumberError, match="out of range") as info:
            values.check_number(given, kind)
        assert values.RANGES[kind].describe() in str(info.value)

    def test_integers_must_be_whole(self):
        with pytest.raises(values.NumberError, match="not a whole number"):
            values.check_number(2.5, "gpus")
        assert values.check_number("8", "gpus") == 8

    def test_booleans_and_text_are_not_numbers(self):
        for given in (True, "eight", None):
            with pytest.raises(values.NumberError, match="not a number"):
                values.check_number(given, "gpus")

    def test_sane_values_pass_with_their_type(self):
        assert values.check_number("2.5", "hours") == 2.5
        assert values.check_number(70e9, "params") == 70_000_000_000


class TestPydanticTypes:
    class Model(BaseModel):
        hours: values.Hours = 1.0
        price: values.UsdPerHour | None = None

    @pytest.mark.parametrize("given", [math.nan, math.inf, "nan", "inf", -2, 0])
    def test_model_fields_refuse_what_check_number_refuses(self, given):
        with pytest.raises(ValidationError, match="hours must be"):
            self.Model(hours=given)

    def test_optional_fields_pass_none(self):
        assert self.Model(price=None).price is None and self.Model(price="98.32").price == 98.32


class TestRunName:
    @pytest.mark.parametrize("given", ["../../etc", "/etc/passwd", "a/b", "run name", ".hidden", "x" * 256, ""])
    def test_paths_and_odd_names_are_refused(self, given):
        with pytest.raises(ValueError, match="is not a plain"):
            values.check_run_name(given)

    def test_a_submitted_job_name_passes(self):
        assert values.check_run_name("cosmoflow-20260101-120000-ab12") == "cosmoflow-20260101-120000-ab12"


class TestCommandLine:
    @pytest.mark.parametrize("hours", ["nan", "inf", "1e400", "-3", "0"])
    @pytest.mark.parametrize("command", ["estimate", "submit"])
    def test_hours_flag_refuses_non_finite_and_absurd_values(self, command, hours):
        extra = ["--dry-run"] if command == "submit" else []
        result = run(command, "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--hours", hours, *extra)
        assert result.exit_code == 2, result.output
        assert "--hours" in result.output and "hours must be" in " ".join(result.output.split())
        assert "$nan" not in result.output and "Traceback" not in result.output

    @pytest.mark.parametrize("resume", ["../../etc", "/abs/path", "a/../b"])
    def test_resume_must_be_a_plain_job_name(self, resume):
        result = run("submit", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--dry-run",
                     "--resume", resume)
        assert result.exit_code == 2 and "is not a plain job name" in " ".join(result.output.split())
        assert "checkpoint" not in result.stdout

    def test_resume_with_a_job_name_lands_in_the_checkpoint_prefix(self):
        result = run("submit", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"), "--dry-run",
                     "--resume", "cosmoflow-20260101-120000-ab12")
        assert result.exit_code == 0, result.output
        assert "cosmoflow/cosmoflow-20260101-120000-ab12" in result.stdout

    @pytest.mark.parametrize("args, flag", [
        (["--params", "1e400", "--largest-layer", "1M", "--gpus", "8", "--gpu-gib", "40"], "--params"),
        (["--params", "7B", "--largest-layer", "1M", "--gpus", "8", "--gpu-gib", "inf", "--json"], "--gpu-gib"),
        (["--params", "7B", "--largest-layer", "1M", "--gpus", "8", "--gpu-gib", "nan", "--json"], "--gpu-gib"),
        (["--params", "2e15", "--largest-layer", "1M", "--gpus", "8", "--gpu-gib", "40"], "--params"),
    ])
    def test_deepspeed_plan_refuses_overflowing_numbers(self, args, flag):
        result = run("deepspeed-plan", *args)
        assert result.exit_code == 2, result.output
        assert flag in result.output and "Traceback" not in result.output
        assert "Infinity" not in result.stdout and "NaN" not in result.stdout

    def test_recipe_numbers_set_on_the_command_line_are_checked(self):
        result = run("estimate", "cosmoflow", "--stack", "prod", "--outputs", outputs_file("prod"),
                     "--set", "cost.expected_hours=.nan")
        assert result.exit_code == 2 and "cost.expected_hours" in result.output
        assert "not a finite number" in " ".join(result.output.split())


class TestStackConfig:
    @pytest.mark.parametrize("key, value, fragment", [
        ("aml-hpc:prices", {"Standard_ND96asr_v4": math.inf}, "US dollars per node-hour"),
        ("aml-hpc:prices", {"Standard_ND96asr_v4": "nan"}, "US dollars per node-hour"),
        ("aml-hpc:prices", {"Standard_ND96asr_v4": 1e9}, "out of range"),
        ("aml-hpc:budget", {"monthlyAmountUsd": math.inf, "alertEmails": ["a@example.com"]}, "US dollars"),
        ("aml-hpc:storage", {"egressGbps": math.nan}, "Gb/s"),
    ])
    def test_non_finite_and_absurd_numbers_are_refused_by_key(self, tmp_path, key, value, fragment):
        from amlhpc.core.errors import UserError
        from amlhpc.infra.config import load_stack_config
        from tests.plan_helpers import write_stack
        from tests.test_config import GOOD_ENV

        write_stack(tmp_path, "dev", {**GOOD_ENV, key: value})
        with pytest.raises(UserError) as info:
            load_stack_config("dev", tmp_path)
        message = info.value.render()
        assert key in message and fragment in message, message
