"""The Makefile's targets as a user types them (`make -n`: what would run, nothing run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TEST_WORKERS"}  # the suite's own run may set it
    return subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


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


def test_make_test_runs_the_suite_script_after_the_bootstrap():
    lines = dry("test").stdout.splitlines()
    assert any("scripts/bootstrap.sh" in line for line in lines)
    assert any("TEST_WORKERS=3 scripts/run_suite.sh" in line for line in lines), lines
    assert any("TEST_WORKERS=2 scripts/run_suite.sh" in line for line in dry("test", "TEST_WORKERS=2").stdout.splitlines())


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for the environment's python: logs what it was asked, as the suite script calls it.
log={log}
if [[ "$2" == mypy ]]; then
  echo "mypy start" >>"$log"; sleep 1; echo "mypy end" >>"$log"
  echo "amlhpc/x.py:1: error: a planted type error"; exit {mypy_status}
fi
case "$*" in *"not alone"*) part=parallel ;; *) part=alone ;; esac
echo "$part start $*" >>"$log"; sleep 0.3; echo "$part end" >>"$log"
[[ $part == parallel ]] && exit {parallel_status}
exit 0
"""


def suite(tmp_path: Path, mypy_status: int, parallel_status: int, workers: str = "3"):
    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(log=log, mypy_status=mypy_status, parallel_status=parallel_status))
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "scripts" / "run_suite.sh")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "SUITE_PYTHON": str(fake),
                                                        "TEST_WORKERS": workers})
    return result, (log.read_text().splitlines() if log.exists() else [])


def test_the_type_check_runs_beside_the_parallel_part_and_its_error_fails_the_run(tmp_path):
    result, calls = suite(tmp_path, mypy_status=1, parallel_status=0)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "a planted type error" in result.stdout, "mypy's findings are shown"
    parallel = next(c for c in calls if c.startswith("parallel start"))
    assert "-n 3 --dist loadfile" in parallel
    assert calls.index("mypy start") < calls.index("mypy end") and calls.index(parallel) < calls.index("mypy end"), \
        f"mypy and the workers overlap: {calls}"
    alone = next(c for c in calls if c.startswith("alone start -m pytest -m alone"))
    assert calls.index(alone) > calls.index("mypy end"), "the alone part has no neighbour"
    assert "tests/test_listing.py" in alone, "the files that mark a test alone, collected alone"


def test_a_failing_parallel_part_fails_the_run_with_its_status(tmp_path):
    result, calls = suite(tmp_path, mypy_status=0, parallel_status=5)
    assert result.returncode == 5 and any(c.startswith("alone start") for c in calls)
    (tmp_path / "clean").mkdir()
    clean, _ = suite(tmp_path / "clean", mypy_status=0, parallel_status=0)
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_a_bad_worker_count_is_refused_before_anything_runs(tmp_path):
    result, calls = suite(tmp_path, mypy_status=0, parallel_status=0, workers="two")
    assert result.returncode == 2 and "TEST_WORKERS must be a whole number" in result.stderr and calls == []
