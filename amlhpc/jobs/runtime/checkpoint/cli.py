"""`python -m amlhpc.jobs.runtime.checkpoint upload|restore|list|prune` with AMLHPC_CHECKPOINT_JSON.

    python -m amlhpc.jobs.runtime.checkpoint upload DIR [--node K]     one version of DIR (its `versions/` tier excluded)
    python -m amlhpc.jobs.runtime.checkpoint restore DIR [--node K]    the latest version into DIR
    python -m amlhpc.jobs.runtime.checkpoint list [--node K]           {"latest", "versions", "pending"}
    python -m amlhpc.jobs.runtime.checkpoint prune [--node K]          retention to `keep` (safe during an upload)
    add --versions to act on the versioned stream (<prefix>/versions) instead of the folder's

Exit 0; 1 on a storage or integrity error (one line that says what to do); 2 on bad input.
`--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from amlhpc.jobs.runtime.base.contract import BLOB_CONNECTION_STRING, CHECKPOINT_JSON
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.base.throttle import Throttle
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.settings import settings_from_env
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
from amlhpc.jobs.runtime.checkpoint.trust import RestoreTrust

CLI_RETRY = {"connect": 1, "total": 3}
"""By hand, an endpoint that does not answer is reported in seconds, not after minutes of retries."""


def storage_problem(exc: BaseException, endpoint: str) -> str | None:
    """One line with the cause and the fix for a storage error the SDK raised; None if not one."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if name == "ServiceRequestError" or isinstance(exc, ConnectionError):
        return (f"cannot reach the Blob endpoint {endpoint}: {_first_line(exc)}. Check account_url in {CHECKPOINT_JSON} "
                f"(or {BLOB_CONNECTION_STRING} for Azurite, and that Azurite runs), DNS and the private endpoint")
    if name == "ClientAuthenticationError" or status in (401, 403):
        return (f"{endpoint} refused the request ({status or 'no token'}): the identity (AZURE_CLIENT_ID, or your az "
                "login) needs 'Storage Blob Data Contributor' on the account; role assignments take minutes to propagate")
    if name in ("ServiceResponseError", "HttpResponseError") or status is not None:
        return f"{endpoint} answered with an error ({status or name}): {_first_line(exc)}; retry, or check the account"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """`python -m amlhpc.jobs.runtime.checkpoint upload|restore|list|prune` with AMLHPC_CHECKPOINT_JSON.
    Exit 0, 1 on a storage or integrity error, 2 on bad input."""
    import os

    from amlhpc.jobs.runtime.blob import blobio

    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.runtime.checkpoint", description=main.__doc__)
    parser.add_argument("action", choices=("upload", "restore", "list", "prune"))
    parser.add_argument("folder", nargs="?", type=Path, help="checkpoint folder (upload, restore)")
    parser.add_argument("--node", type=int, default=0, help="node index, for writers per_node/per_rank (default 0)")
    parser.add_argument("--versions", action="store_true", help="the versioned stream (<prefix>/versions)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of a storage error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        settings = settings_from_env()
        if settings is None:
            raise RuntimeInputError.single(CHECKPOINT_JSON, "", "is not set",
                                           'set it to {"container": "checkpoints", "prefix": "...", ...}')
        if args.action in ("upload", "restore") and args.folder is None:
            raise RuntimeInputError.single("command line", "folder", f"{args.action} needs the checkpoint folder", "")
        if args.versions and args.action == "upload":
            raise RuntimeInputError.single("command line", "--versions", "versioned checkpoints are uploaded by the "
                                           "launcher (every node stages its parts)", "upload the folder without --versions")
        urls = settings.account_urls()  # striped: the first account holds the manifests and `latest`
        retry = blobio.RetrySettings(**CLI_RETRY)
        container = blobio.container_client_from_env(settings.container, urls[0][1] if urls else settings.account_url,
                                                     retry=retry)
        stripes = [(name, container if k == 0 else blobio.container_client_from_env(settings.container, url, retry=retry))
                   for k, (name, url) in enumerate(urls)] if len(urls) > 1 else []
    except RuntimeInputError as exc:
        print(exc.render(), file=sys.stderr)
        return ExitCode.USAGE
    except ValueError as exc:  # blobio.BlobConfigError: never holds a secret
        print(f"checkpoint: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    stream = settings.versions_stream if args.versions else settings.stream(args.node)
    store = CheckpointStore(container, stream, throttle=Throttle.from_mbits_per_s(settings.cap_mbps), node=args.node,
                            stripes=stripes, trust=RestoreTrust.from_environ(os.environ, stream))
    endpoint = blobio.safe_endpoint(settings.account_url, os.environ.get(BLOB_CONNECTION_STRING))
    try:
        if args.action == "upload":
            from amlhpc.jobs.runtime.checkpoint.uploader import FOLDER_EXCLUDE

            result = store.upload(args.folder, settings.keep, exclude=FOLDER_EXCLUDE)
            print(json.dumps({"version": result.version, "uploadedFiles": result.uploaded_files,
                              "reusedFiles": result.reused_files, "uploadedBytes": result.uploaded_bytes,
                              "mbitsPerS": round(result.mbits_per_s, 1), "pruned": result.pruned_versions}))
        elif args.action == "restore":
            manifest = store.restore(args.folder)
            print(json.dumps({"version": manifest.version if manifest else None}))
        elif args.action == "list":
            pointer, _ = store.pointer()
            print(json.dumps({"latest": pointer["version"] if pointer else None, "versions": store.versions(),
                              "pending": sorted(store.pendings())}))
        else:
            dropped, deleted = store.prune(settings.keep)
            print(json.dumps({"prunedVersions": dropped, "deletedBlobs": deleted}))
    except CheckpointError as exc:
        print(f"checkpoint: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        problem = storage_problem(exc, endpoint)
        if problem is None or args.debug:
            raise
        print(f"checkpoint: {problem} (--debug for the traceback)", file=sys.stderr)
        return 1
    return 0
