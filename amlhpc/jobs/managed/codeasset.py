"""The content hash of a managed run's code, checked before the code runs again.

Every attempt of a managed run reuses the controller's own code asset (one upload for the
run), and every revival reruns the controller job with it, as the controller identity. The
asset's files are blobs in the workspace storage (`LocalUpload/<hash>/...` in the
`azureml-blobstore-*` container). The `job-writes-only` condition keeps job identities from
writing there, but the asset is only as intact as every right on that account: a submitter,
an account key where keys are allowed, a right granted outside the model. So the controller
takes the asset's content hash when the run's record is created (in the supervision
container, which no job can write) and compares it before it creates each attempt and before
a revival starts a new controller: a mismatch ends the run with `CodeChanged` in its record
instead of running code nobody submitted.

The hash is SHA-256 over every blob under the asset's path, in name order, of each blob's
name (relative to the path) and the SHA-256 of its bytes as read, never of the Content-MD5 a
writer sets. A code snapshot is the training's source (megabytes), read once per attempt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlparse

ALGORITHM = "sha256"


class CodeChanged(RuntimeError):
    """The code asset's content is not what it was when the run was created."""


class CodeAsset(Protocol):
    name: str
    """The asset as the job names it (an ARM id, or azureml:<name>:<version>)."""

    def digest(self) -> str:
        """The content hash of the asset's files now."""


def content_digest(container: Any, prefix: str) -> str:
    """SHA-256 over the names and contents of every blob under `prefix` in `container` (a
    ContainerClient); ValueError when there is none (an asset with no files is no asset)."""
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    total = hashlib.sha256()
    names = sorted(b.name for b in container.list_blobs(name_starts_with=prefix or None))
    if not names:
        raise ValueError(f"no blob under {prefix or '/'} in container {getattr(container, 'container_name', '?')}")
    for name in names:
        content = hashlib.sha256(container.download_blob(name).readall()).hexdigest()
        total.update(f"{name[len(prefix):]}\0{content}\n".encode())
    return total.hexdigest()


class BlobCodeAsset:
    """A code asset whose files are the blobs under `prefix` of `container`."""

    def __init__(self, name: str, container: Any, prefix: str):
        self.name, self.container, self.prefix = name, container, prefix

    def digest(self) -> str:
        return content_digest(self.container, self.prefix)


def recorded(asset: CodeAsset) -> dict[str, str]:
    """What the run's record keeps of its code: {"asset", "sha256"}."""
    return {"asset": asset.name, ALGORITHM: asset.digest()}


def check(asset: CodeAsset, kept: dict[str, Any] | None) -> None:
    """Raise CodeChanged unless the asset is the one the record kept, with the same content."""
    if not kept:
        return  # a record written before code hashes were kept: nothing to compare with
    if kept.get("asset") != asset.name:
        raise CodeChanged(f"CodeChanged: the run was created with code asset {kept.get('asset')}, "
                          f"this controller runs {asset.name}")
    try:
        now = asset.digest()
    except ValueError as exc:
        raise CodeChanged(f"CodeChanged: code asset {asset.name} has lost its files ({exc})") from None
    if now != kept.get(ALGORITHM):
        raise CodeChanged(f"CodeChanged: code asset {asset.name} was rewritten after the run was created "
                          f"({ALGORITHM} {kept.get(ALGORITHM)} then, {now} now): refusing to run it; submit the "
                          "run again from a checkout you trust")


def parse_blob_url(url: str) -> tuple[str, str, str]:
    """(account URL, container, prefix) of a code asset's `path` (its code_uri,
    https://<account>.blob.core.windows.net/<container>/<prefix>)."""
    parts = urlparse(url)
    container, _, prefix = parts.path.lstrip("/").partition("/")
    if parts.scheme != "https" or not parts.netloc or not container or not prefix:
        raise ValueError(f"code asset path {url!r} is not an https blob URL with a container and a folder")
    return f"https://{parts.netloc}", container, prefix


def azure_code_asset(ml_client: Any, code: str, container_for: Callable[[str, str], Any]) -> BlobCodeAsset:
    """The code asset a job names (`/subscriptions/.../codes/<name>/versions/<v>` or
    `azureml:<name>:<version>`), its files read through `container_for(account_url, container)`."""
    text = code.removeprefix("azureml:")
    if "/codes/" in text:
        name, _, version = text.split("/codes/", 1)[1].partition("/versions/")
    else:
        name, _, version = text.rpartition(":")
    if not name or not version:
        raise ValueError(f"code {code!r} names no code asset version")
    account_url, container, prefix = parse_blob_url(str(ml_client.code.get(name=name, version=version).path))
    return BlobCodeAsset(code, container_for(account_url, container), prefix)
