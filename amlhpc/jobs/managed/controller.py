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

import logging
import os
import signal
import sys
from pathlib import Path

from amlhpc.jobs.managed.settings import code_asset, connect, settings_from_env

log = logging.getLogger("amlhpc.controller")


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
    try:
        code = code_asset(ml_client, own_job.code)
        code.digest()
    except Exception as exc:  # noqa: BLE001 - the identity may not read the storage (an access-key workspace)
        code = None
        log.warning("cannot read the code asset %s (%s: %s): attempts run without its content hash checked",
                    own_job.code, type(exc).__name__, exc)
    supervisor = Supervisor(store, service, evidence, policy, controller=me, resume=resume, echo=log.info, code=code)
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
