"""On a deployed dev stack: a job cannot overwrite a code snapshot in the workspace storage.

Marked `azure`: skipped unless AMLHPC_AZURE_OUTPUTS names a dev stack's outputs file
(`python -m amlhpc.infra outputs --stack dev > dev.json`) and the caller is signed in as a
submitter (`az login`). It proves on Azure what tests/lifecycle/test_trust_boundaries.py
(`TestJobsCannotWriteCode`) decides in the emulator: the GPU clusters' identity holds Storage
Blob Data Contributor on the workspace storage only under the job-writes-only condition
(amlhpc.core.permissions.job_writes_condition).

The test uploads a code asset as the submitter, then runs a job on a GPU cluster that, as the
cluster's identity, tries to overwrite one blob of that snapshot and to write one blob under
its own default outputs; the job writes what Azure answered to its output. Expected: 403
AuthorizationPermissionMismatch for the snapshot (its bytes unchanged afterwards), 201 for the
output.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.azure,
              pytest.mark.skipif(not os.environ.get("AMLHPC_AZURE_OUTPUTS"),
                                 reason="runs against a deployed dev stack: set AMLHPC_AZURE_OUTPUTS")]

PROBE = textwrap.dedent('''\
    """As the cluster's identity: overwrite a snapshot blob, write an output blob; report both."""
    import json, os, sys
    from azure.identity import ManagedIdentityCredential
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobClient

    snapshot_url, output_url, out = sys.argv[1], sys.argv[2], sys.argv[3]
    credential = ManagedIdentityCredential(client_id=os.environ.get("DEFAULT_IDENTITY_CLIENT_ID"))
    answers = {}
    for what, url in (("snapshot", snapshot_url), ("output", output_url)):
        try:
            BlobClient.from_blob_url(url, credential=credential).upload_blob(b"forged", overwrite=True)
            answers[what] = {"status": 201}
        except HttpResponseError as error:
            answers[what] = {"status": error.status_code, "code": error.error_code}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "answers.json"), "w") as handle:
        json.dump(answers, handle)
    ''')


def test_a_job_cannot_overwrite_a_code_snapshot(tmp_path):
    from azure.ai.ml import Output, command
    from azure.ai.ml.entities import Code
    from azure.storage.blob import BlobClient

    from amlhpc.core.outputs import StackOutputs
    from amlhpc.jobs.azure import credentials
    from amlhpc.jobs.azure.submit import connect

    outputs = StackOutputs.model_validate(json.loads(Path(os.environ["AMLHPC_AZURE_OUTPUTS"]).read_text()))
    assert outputs.environment == "dev", "this test deploys nothing, but runs only against dev"
    ml_client = connect(outputs)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "probe.py").write_text(PROBE)
    code = ml_client.code.create_or_update(Code(name="abac-probe", path=str(tmp_path / "code")))
    snapshot_url = f"{code.path.rstrip('/')}/probe.py"  # https://<account>.blob.../azureml-blobstore-<id>/LocalUpload/<hash>/code
    before = BlobClient.from_blob_url(snapshot_url, credential=credentials.credential(credentials.STORAGE)).download_blob().readall()
    container_url = snapshot_url.split("/LocalUpload/")[0]
    cluster = next(iter(outputs.clusters))
    job = command(code=code.id, command="python probe.py ${{inputs.snapshot}} ${{inputs.output}} ${{outputs.answers}}",
                  inputs={"snapshot": snapshot_url, "output": f"{container_url}/azureml/abac-probe/forged.txt"},
                  outputs={"answers": Output(type="uri_folder")}, compute=cluster,
                  environment=next(iter(outputs.registry.environment_ids.values())),
                  experiment_name="abac-probe", display_name="a job overwrites a code snapshot")
    submitted = ml_client.jobs.create_or_update(job)
    ml_client.jobs.stream(submitted.name)
    ml_client.jobs.download(submitted.name, download_path=str(tmp_path / "out"), output_name="answers")
    answers = json.loads(next((tmp_path / "out").rglob("answers.json")).read_text())
    assert answers["snapshot"] == {"status": 403, "code": "AuthorizationPermissionMismatch"}, answers
    assert answers["output"] == {"status": 201}, answers
    after = BlobClient.from_blob_url(snapshot_url, credential=credentials.credential(credentials.STORAGE)).download_blob().readall()
    assert after == before
