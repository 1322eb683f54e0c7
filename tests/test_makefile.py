"""The Makefile's targets as a user types them (`make -n`: what would run, nothing run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, expected", [
    (("plan", "stack=prod"), "-m amlhpc.infra plan --stack prod"),
    (("plan", "STACK=prod"), "-m amlhpc.infra plan --stack prod"),
    (("plan",), "-m amlhpc.infra plan --stack dev"),
    (("new-experiment", "name=x", "env=prod", "days=3"), '-m amlhpc.infra new-experiment "x" --env prod --days 3'),
    (("doctor", "stack=prod"), "-m amlhpc doctor --stack prod"),
])
def test_lower_case_variables_mean_the_same(args, expected):
    result = dry(*args)
    assert result.returncode == 0 and expected in result.stdout, result.stdout + result.stderr


def test_the_two_spellings_disagreeing_stop_make():
    result = dry("plan", "STACK=prod", "stack=dev")
    assert result.returncode != 0 and "STACK=prod and stack=dev disagree" in result.stderr


def test_make_test_type_checks_then_runs_the_suite():
    lines = dry("test").stdout.splitlines()
    mypy = next(i for i, line in enumerate(lines) if "-m mypy" in line)
    pytest_line = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert mypy < pytest_line
