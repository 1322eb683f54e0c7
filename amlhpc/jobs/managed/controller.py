"""`python -m amlhpc.jobs.managed.controller`: the controller job of a managed run.

Runs on the stack's controller cluster as the controller identity (AZURE_CLIENT_ID) and
takes its settings - its rules included - from its own job definition, AMLHPC_MANAGED_JSON
(written by render.py), never from a blob:

    {"run": "<run>", "recipe": "<recipe>", "experiment": "<experiment>",
     "workspace": {"subscription_id", "resource_group", "name"},
     "storage": {"account_url", "container", "prefix", "writers", "supervision"},
     "policy": {...},                    # amlhpc.jobs.managed.policy.Policy, with its targets' templates
     "secret": "<64 hex>",               # signs the attempts' evidence (amlhpc.jobs.runtime.coord.nodestatus)
     "resume": {"token", "at"} | null}   # an explicit `submit --managed --resume`

It opens the run's record (record.py, in the supervision container), makes sure the run's
revival schedule exists (revive.py), then loops (supervisor.py) until the run is done: exit
0 when the training completed, 1 when the run failed or was canceled (the reason is the
last line of the log and in the record), 2 for bad settings. On SIGTERM (the job canceled,
or its node going away) it releases the record's lease, so a new controller can take over
at once; nothing else is lost, everything is in the record.

Imports only the standard library, amlhpc.jobs.managed, amlhpc.jobs.runtime and the Azure SDKs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANAGED_JSON = "AMLHPC_MANAGED_JSON"
REQUIRED = {"run": str, "recipe": str, "experiment": str, "workspace": dict, "storage": dict, "policy": dict,
            "secret": str}
_SECRET = re.compile(r"^[0-9a-f]{64}$")

log = logging.getLogger("amlhpc.controller")


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The controller's settings; ValueError names what is missing or wrong."""
    text = environ.get(MANAGED_JSON, "").strip()
    if not text:
        raise ValueError(f"{MANAGED_JSON} is not set: submit the run with `python -m amlhpc.jobs submit RECIPE --managed`")
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{MANAGED_JSON} is not valid JSON ({exc.msg})") from None
    wrong = [key for key, kind in REQUIRED.items() if not isinstance(settings.get(key), kind)]
    wrong += [f"storage.{k}" for k in ("account_url", "container", "prefix", "supervision")
              if not settings.get("storage", {}).get(k)]
    wrong += [f"workspace.{k}" for k in ("subscription_id", "resource_group", "name")
              if not settings.get("workspace", {}).get(k)]
    if isinstance(settings.get("secret"), str) and not _SECRET.match(settings["secret"]):
        wrong.append("secret (64 lowercase hex characters)")
    resume = settings.get("resume")
    if resume is not None and not (isinstance(resume, dict) and resume.get("token") and resume.get("at")):
        wrong.append("resume ({token, at} or null)")
    if wrong:
        raise ValueError(f"{MANAGED_JSON}: missing or wrong: {', '.join(wrong)}")
    return settings


def connect(settings: dict[str, Any]):
    """(MLClient, the run's RecordStore, Evidence) as the controller identity."""
    from azure.ai.ml import MLClient

    from amlhpc.jobs.managed.evidence import Evidence
    from amlhpc.jobs.managed.policy import Policy
    from amlhpc.jobs.managed.record import RecordStore
    from amlhpc.jobs.runtime.blob import blobio

    credential = blobio.credential_from_env(os.environ)
    ws, storage = settings["workspace"], settings["storage"]
    ml_client = MLClient(credential, ws["subscription_id"], ws["resource_group"], ws["name"])
    checkpoints = blobio.container_client_from_env(storage["container"], storage["account_url"], env=os.environ)
    supervision = blobio.container_client_from_env(storage["supervision"], storage["account_url"], env=os.environ)
    policy = Policy.from_json(settings["policy"])
    store = RecordStore(supervision, storage["prefix"], lease_s=policy.lease_s)
    evidence = Evidence(checkpoints, storage["prefix"], storage.get("writers", "rank0"), settings["secret"])
    return ml_client, store, evidence


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        settings = settings_from_env(os.environ)
    except ValueError as exc:
        print(f"controller: {exc}", file=sys.stderr)
        return 2
    from amlhpc.jobs.managed import revive
    from amlhpc.jobs.managed.azureml import AzureJobService
    from amlhpc.jobs.managed.policy import Policy
    from amlhpc.jobs.managed.report import summary_lines
    from amlhpc.jobs.managed.supervisor import Resume, Supervisor

    me = os.environ.get("AZUREML_RUN_ID", "").strip()
    if not me:
        print("controller: AZUREML_RUN_ID is not set: this entry point runs as an Azure ML job", file=sys.stderr)
        return 2
    ml_client, store, evidence = connect(settings)
    own_job = ml_client.jobs.get(me)
    store.add_controller(me, "started")
    policy = Policy.from_json(settings["policy"])
    service = AzureJobService(ml_client, Path("."), own_job.code, settings["run"], settings["experiment"],
                              max_nodes={t.cluster: t.max_nodes for t in policy.targets if t.max_nodes})
    resume = Resume(**settings["resume"]) if settings.get("resume") else None
    supervisor = Supervisor(store, service, evidence, policy, controller=me, resume=resume, echo=log.info)
    try:
        revive.ensure_schedule(ml_client, own_job, settings["run"])
    except Exception as exc:  # noqa: BLE001 - supervision goes on; only the revival is missing
        log.warning("could not create the revival schedule %s (%s: %s): a controller that dies is not replaced "
                    "by itself - resume with `submit --managed --resume %s`", revive.schedule_name(settings["run"]),
                    type(exc).__name__, exc, settings["run"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through start(): the lease is released
    record = supervisor.start(settings["run"], settings["recipe"])
    for line in summary_lines(record):
        log.info("%s", line)
    if record.done:
        revive.remove_schedule(ml_client, settings["run"])
    return 0 if record.state == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
