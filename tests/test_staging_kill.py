"""SIGKILL in the middle of staging, then a re-run: it finishes, fetches no finished file again,
and never leaves a partial file under a final name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from amlhpc.jobs.data import upload
from bench.dataset import generate
from tests.test_staging import ROOT, data_files, node_env, source_files, spec_json

pytestmark = pytest.mark.azurite


def test_killed_staging_resumes_without_refetching(azurite, container, tmp_path):
    source = tmp_path / "source"
    generate(source, universes=2, files_per_universe=40, file_bytes=256 << 10, seed=5)
    upload.upload_directory(container, source, "cosmoflow", workers=2)
    expected = source_files(source)
    env = node_env(azurite, tmp_path, 0, 0, 1, 1, "kill-run", shared=False)
    argv = [sys.executable, "-m", "amlhpc.jobs.runtime.staging", "--stage-json", spec_json(container.container_name, "local"),
            "--fast-retries", "--json", "-q"]
    staging_dir = tmp_path / "node0" / ".amlhpc-staging" / "cosmo"
    data_dir = tmp_path / "node0" / "cosmo"

    # 0.5 MB/s: the 1 MiB burst goes at once, the remaining few MB take seconds, so there is a middle to kill in.
    victim = subprocess.Popen([*argv, "--cap-mbps", "4"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if data_dir.is_dir() and sum(1 for _ in data_dir.iterdir()) >= 10:
            break
        assert victim.poll() is None, victim.stderr.read()
        time.sleep(0.05)
    else:
        pytest.fail("staging never got going")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL

    present = data_files(data_dir)
    assert 10 <= len(present) < len(expected), "the kill did not land mid-staging"
    for name, content in present.items():  # nothing partial or corrupt under a final name
        assert content == expected[name], name
    partials = list((staging_dir / "partial").iterdir())
    assert partials, "expected downloads in flight at the kill"

    rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads(rerun.stdout)["inputs"][0]
    # Every finished file kept, none fetched again: recorded ones skipped, the rest (finished after the
    # manifest's last batch) adopted once their SHA-256 matched.
    assert result["files_skipped"] == len(present)
    assert result["files_downloaded"] == len(expected) - len(present)
    assert data_files(data_dir) == expected
    assert list((staging_dir / "partial").iterdir()) == []
    assert not any(p.name.endswith(".partial") for p in data_dir.rglob("*"))
    assert os.path.exists(tmp_path / "reports" / "staging-node0.json")
