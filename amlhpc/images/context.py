"""The build context of one image: exactly which files go in, their hash, and staging.

`az acr build` uploads a directory. We never upload the repository root (it holds .venv,
node_modules and local state); instead each build gets a small staged directory:

    Dockerfile                      amlhpc/images/<folder>/Dockerfile (plus anything else there)
    aml-hpc/                        amlhpc/images/common/**   -> /opt/aml-hpc in the image
    aml-hpc/python/amlhpc/__init__.py       generated stubs (the repository's belong to the
    aml-hpc/python/amlhpc/jobs/__init__.py  submit side and may grow imports the image lacks)
    aml-hpc/python/amlhpc/jobs/runtime/**   amlhpc/jobs/runtime/** -> launcher, staging, health

The content hash covers every staged file (path, bytes, executable bit) and the image's
build args, so the tag is stable across machines and checkouts and changes whenever
anything that shapes the image changes. Pure: no Pulumi, no Azure SDK, no subprocess.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

HASH_FORMAT = "aml-hpc-image-context v1"
"""Bump when the hashing scheme itself changes (forces new tags everywhere)."""
TAG_LENGTH = 12
"""Hex characters of the SHA-256 used as the image tag (48 bits: ample for one registry)."""

RUNTIME_SOURCE = Path("amlhpc/jobs/runtime")
COMMON_SOURCE = Path("amlhpc/images/common")
CONTEXT_PREFIX = "aml-hpc"
PYTHON_DIR = f"{CONTEXT_PREFIX}/python"
PACKAGE_STUB = b'"""aml-hpc as installed in the training image: only amlhpc.jobs.runtime is here."""\n'
JOBS_STUB = (
    b'"""aml-hpc job runtime as installed in the training image: only amlhpc.jobs.runtime is here.\n\n'
    b"The image build generates this file; the repository's amlhpc/jobs/__init__.py belongs to the\n"
    b'submit side. See docs/images.md."""\n'
)

# Editor, OS and interpreter litter and docs never change the image, so they never change the tag.
_IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_IGNORED_SUFFIXES = (".pyc", ".pyo", ".swp", "~", ".orig", ".rej", ".md")
"""Includes Markdown: notes next to the files (nccl-topo/README.md) are not image content."""
_IGNORED_NAMES = {".DS_Store", "Thumbs.db"}


@dataclass(frozen=True)
class ContextFile:
    data: bytes
    executable: bool


def _wanted(path: Path) -> bool:
    if path.name in _IGNORED_NAMES or path.name.endswith(_IGNORED_SUFFIXES):
        return False
    return not any(part in _IGNORED_DIRS for part in path.parts)


def _walk(source: Path) -> list[Path]:
    if not source.is_dir():
        return []
    return sorted(p for p in source.rglob("*") if p.is_file() and _wanted(p.relative_to(source)))


def _read(path: Path) -> ContextFile:
    mode = path.stat().st_mode
    return ContextFile(path.read_bytes(), bool(mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)))


def context_files(folder: str, root: Path = REPO_ROOT, runtime: bool = True) -> dict[str, ContextFile]:
    """Context-relative POSIX path -> file, for the image whose Dockerfile is in amlhpc/images/<folder>
    (`runtime`: with amlhpc/images/common and amlhpc/jobs/runtime, as every training image has them)."""
    files: dict[str, ContextFile] = {}
    image_dir = root / "amlhpc" / "images" / folder
    for path in _walk(image_dir):
        files[path.relative_to(image_dir).as_posix()] = _read(path)
    if not runtime:
        return dict(sorted(files.items()))
    common = root / COMMON_SOURCE
    for path in _walk(common):
        files[f"{CONTEXT_PREFIX}/{path.relative_to(common).as_posix()}"] = _read(path)
    runtime_dir = root / RUNTIME_SOURCE
    for path in _walk(runtime_dir):
        files[f"{PYTHON_DIR}/amlhpc/jobs/runtime/{path.relative_to(runtime_dir).as_posix()}"] = _read(path)
    files[f"{PYTHON_DIR}/amlhpc/__init__.py"] = ContextFile(PACKAGE_STUB, False)
    files[f"{PYTHON_DIR}/amlhpc/jobs/__init__.py"] = ContextFile(JOBS_STUB, False)
    return dict(sorted(files.items()))


def content_hash(files: Mapping[str, ContextFile], build_args: Mapping[str, str]) -> str:
    """SHA-256 over the staged files and the build args, as TAG_LENGTH hex characters."""
    digest = hashlib.sha256()
    digest.update(HASH_FORMAT.encode() + b"\n")
    for name in sorted(files):
        item = files[name]
        # Length-prefixed fields: no two different contexts can serialize the same.
        digest.update(f"file {len(name)} {name} {'x' if item.executable else '-'} {len(item.data)}\n".encode())
        digest.update(item.data)
    for key in sorted(build_args):
        value = build_args[key]
        digest.update(f"arg {len(key)} {key} {len(value)} {value}\n".encode())
    return digest.hexdigest()[:TAG_LENGTH]


def stage(files: Mapping[str, ContextFile], dest: Path) -> Path:
    """Write the context into an empty (or new) directory `dest`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty; a build context must hold only its own files")
    for name, item in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.data)
        os.chmod(target, 0o755 if item.executable else 0o644)
    return dest


def read_staged(dest: Path) -> dict[str, ContextFile]:
    """The files of a staged context, for verification (hash what would be uploaded)."""
    return {p.relative_to(dest).as_posix(): _read(p) for p in sorted(dest.rglob("*")) if p.is_file()}
