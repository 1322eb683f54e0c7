"""A mounted input that names no version is pinned, when the job is submitted, to its dataset's
latest committed version (amlhpc/jobs/data/pin.py): the job reads `<path>/v<k>/`, never the
folder whole with a version still being written. Versions written by the real `jobs data upload`
code on Azurite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from azure.core.exceptions import HttpResponseError

from amlhpc.jobs import recipes
from amlhpc.jobs.data import pin, versions
from amlhpc.jobs.plan import build
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.staging import dataversion
from tests.jobs_helpers import outputs_doc, stack_outputs

pytestmark = pytest.mark.azurite

REPO = Path(__file__).resolve().parents[1]


def dataset(root: Path, tag: str) -> Path:
    folder = root / tag
    folder.mkdir(parents=True)
    (folder / "annotations.json").write_text(json.dumps({"version": tag}))
    return folder


@pytest.fixture
def two_versions_and_a_third_being_written(container, tmp_path):
    for tag in ("one", "two"):
        versions.upload_version(container, dataset(tmp_path, tag), "coco", workers=1)
    container.upload_blob(dataversion.marker_name("coco", 3), b'{"session": "elsewhere"}')
    return container


def lister_of(container):
    return lambda prefix: versions.list_versions(container, prefix)


def maskrcnn(**sets):
    return recipes.load("maskrcnn", recipes.parse_overrides([f"{k}={v}" for k, v in sets.items()]))


class TestPin:
    def test_a_mounted_input_takes_the_latest_committed_version(self, two_versions_and_a_third_being_written):
        pinned = pin.pin_mounted_inputs(maskrcnn(**{"inputs.coco.path": "coco"}),
                                        lister_of(two_versions_and_a_third_being_written))
        assert pinned.recipe.inputs["coco"].version == 2, "3 has no manifest yet"
        assert pinned.notes == ["input 'coco' (download): version 2 of coco, the latest committed; 3 still being "
                                "written; pinned in the job (coco/v2/)"]
        plan = build.plan_job(pinned.recipe, stack_outputs("dev"))
        assert plan.inputs["coco"]["path"].endswith("/paths/coco/v2/")
        assert not any("whole" in w for w in plan.warnings)

    def test_a_named_version_or_a_staged_input_is_left_alone(self, two_versions_and_a_third_being_written):
        lister = lister_of(two_versions_and_a_third_being_written)
        named = maskrcnn(**{"inputs.coco.path": "coco", "inputs.coco.version": 1})
        assert pin.pin_mounted_inputs(named, lister).recipe.inputs["coco"].version == 1
        staged = maskrcnn(**{"inputs.coco.path": "coco", "inputs.coco.mode": "stage"})
        assert pin.pin_mounted_inputs(staged, lister).recipe.inputs["coco"].version is None, \
            "staging takes the latest itself, when every node agrees on it"

    def test_a_folder_without_versions_is_mounted_whole_with_the_warning(self, container):
        recipe = maskrcnn(**{"inputs.coco.path": "plain-folder"})
        container.upload_blob("plain-folder/train/000001.jpg", b"jpeg")
        pinned = pin.pin_mounted_inputs(recipe, lister_of(container))
        assert pinned.recipe is recipe and pinned.notes == [] and pinned.warnings == []
        assert any("reads the folder plain-folder/ whole" in w for w in build.plan_job(recipe, stack_outputs("dev")).warnings)

    def test_a_listing_refused_says_so_and_the_submission_goes_on(self):
        def refused(prefix):
            raise HttpResponseError(message="This request is not authorized to perform this operation using this "
                                            "permission. ErrorCode:AuthorizationPermissionMismatch")
        recipe = maskrcnn(**{"inputs.coco.path": "coco"})
        pinned = pin.pin_mounted_inputs(recipe, refused)
        assert pinned.recipe is recipe
        (warning,) = pinned.warnings
        assert "could not list coco/_versions/" in warning and "inputs.coco.version=K" in warning
        assert "AuthorizationPermissionMismatch" in warning or "not authorized" in warning


def test_submit_pins_it_in_the_job(two_versions_and_a_third_being_written, azurite, tmp_path):
    doc = outputs_doc("dev")
    doc["storage"]["containers"]["datasets"] = two_versions_and_a_third_being_written.container_name
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(doc))
    job = tmp_path / "job.yml"
    env = {**os.environ, contract.BLOB_CONNECTION_STRING: azurite.connection_string}
    result = subprocess.run([sys.executable, "-m", "amlhpc.jobs", "submit", "maskrcnn", "--stack", "dev", "--outputs",
                             str(outputs), "--dry-run", "--out", str(job), "--set", "inputs.coco.path=coco"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "version 2 of coco, the latest committed" in " ".join(result.stderr.split())
    document = yaml.safe_load(job.read_text())
    assert document["inputs"]["coco"]["path"] == f"azureml://datastores/{doc['datastores']['datasets']}/paths/coco/v2/"
