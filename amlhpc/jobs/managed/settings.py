"""A managed run's controller settings (AMLHPC_MANAGED_JSON, written by render.py into the
controller's job definition) and the clients they open as the controller identity. The
controller (controller.py) and the revival check (revive.py) both start here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

MANAGED_JSON = "AMLHPC_MANAGED_JSON"
REQUIRED = {"run": str, "recipe": str, "experiment": str, "workspace": dict, "storage": dict, "policy": dict,
            "secret": str}
_SECRET = re.compile(r"^[0-9a-f]{64}$")


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The controller's settings; ValueError names what is missing or wrong."""
    text = environ.get(MANAGED_JSON, "").strip()
    if not text:
        raise ValueError(f"{MANAGED_JSON} is not set: submit the run with `jobs submit RECIPE --managed`")
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
    # the coordination account (settings written before it existed: the checkpoints' account)
    supervision = blobio.container_client_from_env(storage["supervision"],
                                                   storage.get("supervision_account_url") or storage["account_url"],
                                                   env=os.environ)
    policy = Policy.from_json(settings["policy"])
    store = RecordStore(supervision, storage["prefix"], lease_s=policy.lease_s)
    evidence = Evidence(checkpoints, storage["prefix"], storage.get("writers", "rank0"), settings["secret"])
    return ml_client, store, evidence


def code_asset(ml_client, code: str):
    """The code asset a controller job names (its `code`), its files read from the workspace
    storage as the controller identity (amlhpc.jobs.managed.codeasset)."""
    from amlhpc.jobs.managed.codeasset import azure_code_asset
    from amlhpc.jobs.runtime.blob import blobio

    return azure_code_asset(ml_client, code, lambda account_url, container: blobio.container_client_from_env(
        container, account_url, env=os.environ))
