"""Upload a dataset as a new version, and describe the Azure ML data asset that names it.

The layout and the manifest are amlhpc.jobs.runtime.staging.dataversion's (staging reads them).
An upload of dataset NAME:

1. claims the next version k: lists `NAME/_versions/` and creates `NAME/_versions/<k>.uploading`
   create-only (If-None-Match: *); a second upload that picked the same k meets a 409 and
   takes k+1, so two uploads never share a version;
2. uploads the files under `NAME/v<k>/` (amlhpc.jobs.data.upload: gzip, checksums, conditional
   commits);
3. lists `NAME/v<k>/` once and writes the manifest `NAME/_versions/<k>.json` create-only (its
   files with sizes, etags, Content-MD5 and checksums, and their digest; above
   dataversion.PART_ROWS files, an index of parts under `NAME/_parts/<k>/`, each written
   create-only before it): the version is committed from this write on, and only then;
4. deletes the marker.

A failed or interrupted upload leaves its marker and no manifest: staging never sees the
version (it takes the newest committed one), and refuses it by number while it is being
written. `resume=k` finishes such a version (the same folder: files already committed are
skipped). A committed version is never written again: a changed dataset is a new version,
and a job stages exactly one version, whatever is uploaded while it stages.

`asset(...)` builds the azure-ai-ml `Data` entity (name, version, uri_folder on the stack's
datasets datastore) that registers the version as an Azure ML data asset
(learn.microsoft.com/azure/machine-learning/how-to-create-data-assets, read 2026-11-28).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.data import remote
from amlhpc.jobs.data.upload import (
    UploadError,
    UploadReport,
    blob_name,
    check_names,
    decide,
    new_session,
    sha256_file,
    upload_directory,
)
from amlhpc.jobs.data.walk import scan as walk_scan
from amlhpc.jobs.runtime.base import faultpoints
from amlhpc.jobs.runtime.staging import dataversion

CLAIM_ATTEMPTS = 20
MANIFEST_METADATA = (remote.META_SIZE, remote.META_SHA256, remote.META_STORED_SHA256, "amlhpc_members")
"""The metadata a manifest keeps of each blob: what staging checks the bytes against."""


@dataclass
class VersionReport:
    dataset: str
    version: int
    manifest: str
    """The manifest's blob name."""
    digest: str
    files: int
    bytes: int
    """Stored bytes of the version."""
    upload: UploadReport

    unchanged: bool = False
    """The folder is the latest committed version already: no new version was made."""

    def to_json(self) -> dict[str, Any]:
        """The upload's report, with the version's fields beside it."""
        return {**self.upload.to_json(), "dataset": self.dataset, "version": self.version, "manifest": self.manifest,
                "digest": self.digest, "version_files": self.files, "version_bytes": self.bytes,
                "version_unchanged": self.unchanged}


def list_versions(container, dataset: str) -> dataversion.Versions:
    """The committed versions of `dataset` and those being written (one listing of `_versions/`)."""
    found = container.list_blobs(name_starts_with=dataversion.versions_prefix(dataset))
    return dataversion.parse_listing(dataset, [(p.name, int(p.size or 0), p.etag) for p in found])


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _create_or_own(container, name: str, body: bytes, owned: Any) -> bool:
    """Write `name` create-only. True when this call (or its retry after a lost reply) created it;
    False when another writer holds it. `owned(existing_bytes)` says whether a blob found there is ours."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import ContentSettings

    try:
        container.upload_blob(name, body, overwrite=False,
                              content_settings=ContentSettings(content_type="application/json"))
        return True
    except ResourceExistsError:
        # A retry of our own write whose reply was lost meets its own first write: read it back.
        return bool(owned(container.download_blob(name).readall()))


def _claim(container, dataset: str, session: str) -> int:
    """The next version number, held by this upload's marker (see the module docstring)."""
    for _ in range(CLAIM_ATTEMPTS):
        version = list_versions(container, dataset).next
        body = json.dumps({"session": session, "who": remote.who(), "started": _utc()}).encode()
        if _create_or_own(container, dataversion.marker_name(dataset, version), body,
                          lambda data: json.loads(data or b"{}").get("session") == session):
            return version
    raise UploadError(f"could not claim a version of {dataset}: {CLAIM_ATTEMPTS} other uploads took the next number "
                      "first; try again")


def _same_as_latest(container, local_dir: Path, dataset: str, upload_options: dict[str, Any]) -> VersionReport | None:
    """The latest committed version's report when `local_dir` holds exactly its files, unchanged
    (the uploader's own skip rule, amlhpc.jobs.data.upload.decide), else None."""
    versions = list_versions(container, dataset)
    latest = versions.latest
    if latest is None or upload_options.get("rewrite") or upload_options.get("verify_stored"):
        return None
    files = upload_options.get("files")
    local_files = list(files) if files is not None else walk_scan(local_dir).files
    prefix = dataversion.data_prefix(dataset, latest)
    blobs = remote.list_remote(container, prefix)
    names = {blob_name(prefix, f.rel): f for f in local_files}
    if set(names) != set(blobs):
        return None
    checksum = bool(upload_options.get("checksum"))
    for name, local in names.items():
        action = decide(local, blobs[name], checksum=checksum)
        # A committed version's blobs are never touched (a metadata write would change the etags its
        # manifest holds): a file whose times differ is hashed and compared, not refreshed.
        if action == "check" and sha256_file(local.path) == blobs[name].metadata.get(remote.META_SHA256):
            continue
        if action != "skip":
            return None
    manifest = dataversion.manifest_name(dataset, latest)
    data = container.download_blob(manifest).readall()
    digest = json.loads(data).get("digest", "")
    report = UploadReport(files=len(local_files), unchanged=len(local_files),
                          skipped=list(upload_options.get("skipped") or ()))
    return VersionReport(dataset, latest, manifest, digest, len(blobs), sum(b.size for b in blobs.values()), report,
                         unchanged=True)


def upload_version(container, local_dir: Path, dataset: str, *, resume: int | None = None,
                   session: str | None = None, allow_skips: bool = True, part_rows: int | None = None,
                   **upload_options: Any) -> VersionReport:
    """Upload `local_dir` as a new version of `dataset` (or finish version `resume`); raises
    UploadError naming the version and how to finish it. A folder that is the latest committed
    version already makes no new version (the report says `unchanged`). With `allow_skips`
    False, entries the walk could not upload leave the version uncommitted. `part_rows`: files
    a manifest part holds (default dataversion.PART_ROWS)."""
    dataset = remote.normalize_prefix(dataset)
    session = session or new_session()
    files = upload_options.get("files")
    if files is None:
        walked = walk_scan(local_dir)
        upload_options = {**upload_options, "files": walked.files,
                          "skipped": upload_options.get("skipped") or walked.skipped}
    check_names(dataversion.data_prefix(dataset, resume or list_versions(container, dataset).next),
                upload_options["files"])
    if resume is None:
        same = _same_as_latest(container, local_dir, dataset, upload_options)
        if same is not None:
            return same
        version = _claim(container, dataset, session)
    else:
        versions = list_versions(container, dataset)
        if resume in versions.committed:
            raise UploadError(f"version {resume} of {dataset} is committed, and a committed version never changes: "
                              "upload the changed dataset as a new version (drop --resume)")
        if resume not in versions.writing:
            raise UploadError(f"version {resume} of {dataset} is not being written ({versions.describe()}): "
                              "drop --resume to upload a new version")
        version = resume
    faultpoints.reach("dataset.marker-written", dataset=dataset, version=version)
    prefix = dataversion.data_prefix(dataset, version)
    finish = f"re-run with --resume {version} to finish version {version} (staging ignores it until then)"
    try:
        report = upload_directory(container, local_dir, prefix, session=session, **upload_options)
    except UploadError as exc:
        raise UploadError(f"version {version} of {dataset} is not committed: {exc}\n{finish}", exc.report) from None
    if report.skipped and not allow_skips:
        raise UploadError(f"version {version} of {dataset} is not committed: {len(report.skipped)} entr"
                          f"{'y' if len(report.skipped) == 1 else 'ies'} could not be uploaded (listed below); fix or "
                          f"remove them and {finish}, or pass --allow-skips to commit the version without them", report)
    faultpoints.reach("dataset.files-uploaded", dataset=dataset, version=version)
    if report.remote_only:
        raise UploadError(f"version {version} of {dataset} holds {len(report.remote_only)} blob(s) with no file in "
                          f"{local_dir} (e.g. {report.remote_only[0]}): it was started from another folder; upload "
                          "this folder as a new version (drop --resume)", report)
    blobs = remote.list_remote(container, prefix)
    rows = [[b.name, b.size, b.etag, b.content_encoding, b.content_md5,
             {k: v for k, v in b.metadata.items() if k in MANIFEST_METADATA}] for b in blobs.values()]
    manifest, parts = dataversion.build_version(dataset, version, f"{prefix}/", rows, created=_utc(), session=session,
                                                 part_rows=part_rows)
    for part, part_body in parts:  # before the manifest: a committed index names only parts that exist
        # Another upload of this version with the same files wrote the same bytes: the part is shared.
        if not _create_or_own(container, part, part_body, part_body.__eq__):
            raise UploadError(f"version {version} of {dataset}: {part} holds other rows than this upload's (the "
                              "name carries the listing's digest, so another writer put it there): upload again as "
                              "a new version")
    if parts:
        faultpoints.reach("dataset.parts-written", dataset=dataset, version=version)
    name = dataversion.manifest_name(dataset, version)
    body = json.dumps(manifest, indent=1, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if not _create_or_own(container, name, body, lambda data: json.loads(data).get("digest") == manifest["digest"]):
        raise UploadError(f"version {version} of {dataset} was committed by another upload while this one ran: "
                          "upload again as a new version")
    faultpoints.reach("dataset.manifest-written", dataset=dataset, version=version)
    from azure.core.exceptions import ResourceNotFoundError

    try:
        container.delete_blob(dataversion.marker_name(dataset, version))
    except ResourceNotFoundError:
        pass
    return VersionReport(dataset, version, name, manifest["digest"], len(rows), manifest["bytes"], report)


def asset(dataset: str, version: int, datastore: str, description: str = ""):
    """The azure-ai-ml `Data` entity registering version `version` of `dataset` as an Azure ML data
    asset (a uri_folder on the datasets datastore); `MLClient.data.create_or_update(asset(...))`
    registers it."""
    from azure.ai.ml.constants import AssetTypes
    from azure.ai.ml.entities import Data

    name = dataset.replace("/", "-")
    return Data(name=name, version=str(version), type=AssetTypes.URI_FOLDER,
                path=f"azureml://datastores/{datastore}/paths/{dataversion.data_prefix(dataset, version)}/",
                description=description or f"aml-hpc dataset {dataset} version {version}",
                tags={"amlhpc_manifest": dataversion.manifest_name(dataset, version)})
