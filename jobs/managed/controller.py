"""`python -m jobs.managed.controller`: the controller job of a managed run.

Runs on the stack's controller cluster as the controller identity (AZURE_CLIENT_ID) and
reads its settings from AMLHPC_MANAGED_JSON (written by render.py):

    {"run": "<run>", "recipe": "<recipe>", "experiment": "<experiment>",
     "workspace": {"subscription_id", "resource_group", "name"},
     "storage": {"account_url", "container", "prefix", "writers"},
     "template": "managed/training-job.yml",
     "policy": {...}}                                  # jobs.managed.policy.Policy

It opens the run's record (record.py), then loops (supervisor.py) until the run is done:
exit 0 when the training completed, 1 when the run failed or was canceled (the reason is
the last line of the log and in the record), 2 for bad settings. On SIGTERM (the job
canceled, or its node going away) it releases the record's lease, so a new controller can
take over at once; nothing else is lost, everything is in the record.

Imports only the standard library, jobs.managed, jobs.runtime and the Azure SDKs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANAGED_JSON = "AMLHPC_MANAGED_JSON"
REQUIRED = {"run": str, "recipe": str, "experiment": str, "workspace": dict, "storage": dict, "template": str,
            "policy": dict}

log = logging.getLogger("amlhpc.controller")


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The controller's settings; ValueError names what is missing or wrong."""
    text = environ.get(MANAGED_JSON, "").strip()
    if not text:
        raise ValueError(f"{MANAGED_JSON} is not set: submit the run with `python -m jobs submit RECIPE --managed`")
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{MANAGED_JSON} is not valid JSON ({exc.msg})") from None
    wrong = [key for key, kind in REQUIRED.items() if not isinstance(settings.get(key), kind)]
    wrong += [f"storage.{k}" for k in ("account_url", "container", "prefix") if not settings.get("storage", {}).get(k)]
    wrong += [f"workspace.{k}" for k in ("subscription_id", "resource_group", "name")
              if not settings.get("workspace", {}).get(k)]
    if wrong:
        raise ValueError(f"{MANAGED_JSON}: missing or wrong: {', '.join(wrong)}")
    return settings


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        settings = settings_from_env(os.environ)
    except ValueError as exc:
        print(f"controller: {exc}", file=sys.stderr)
        return 2
    from azure.ai.ml import MLClient

    from jobs.managed.azureml import AzureJobService
    from jobs.managed.evidence import Evidence
    from jobs.managed.policy import Policy
    from jobs.managed.record import RecordStore
    from jobs.managed.report import summary_lines
    from jobs.managed.supervisor import Supervisor
    from jobs.runtime import blobio

    credential = blobio.credential_from_env(os.environ)
    ws, storage = settings["workspace"], settings["storage"]
    ml_client = MLClient(credential, ws["subscription_id"], ws["resource_group"], ws["name"])
    me = os.environ.get("AZUREML_RUN_ID", "").strip()
    if not me:
        print("controller: AZUREML_RUN_ID is not set: this entry point runs as an Azure ML job", file=sys.stderr)
        return 2
    code = ml_client.jobs.get(me).code
    container = blobio.container_client_from_env(storage["container"], storage["account_url"], env=os.environ)
    store = RecordStore(container, storage["prefix"])
    service = AzureJobService(ml_client, Path(settings["template"]), code, settings["run"], settings["experiment"])
    supervisor = Supervisor(store, service, Evidence(container, storage["prefix"], storage.get("writers", "rank0")),
                            controller=me, echo=log.info)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through start(): the lease is released
    record = supervisor.start(settings["run"], settings["recipe"], Policy.from_json(settings["policy"]))
    for line in summary_lines(record):
        log.info("%s", line)
    return 0 if record.state == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
