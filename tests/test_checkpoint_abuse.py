"""A job tries to take over another run through its checkpoints (every job's identity can write
the whole checkpoints container): it writes into the victim's prefix a manifest that points
outside the restore folder, and checkpoint files that carry a pickle payload. Each is refused
with its reason, nothing is written outside the folder, and the payload never runs.

Real Azurite, the real store, the real torch loaders."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.checkpoint import CheckpointStore, UnsafeCheckpoint

pytestmark = pytest.mark.azurite
VICTIM = "victim-run"


def forge(container, manifest_files: list[dict], blobs: dict[str, bytes], version: str = "000002-forged") -> None:
    """What the attacking job writes into the victim's stream: blobs, a manifest, the pointer."""
    for name, data in blobs.items():
        container.upload_blob(name, data, overwrite=True)
    manifest = {"schema": 1, "version": version, "sequence": 2, "createdAt": "2026-11-26T00:00:00+00:00",
                "meta": {"layout": "folder"}, "files": manifest_files}
    container.upload_blob(f"{VICTIM}/manifests/{version}.json", json.dumps(manifest).encode(), overwrite=True)
    container.upload_blob(f"{VICTIM}/latest", json.dumps({"schema": 1, "version": version,
                                                         "manifest": f"{VICTIM}/manifests/{version}.json"}).encode(),
                          overwrite=True)


def entry(path: str, data: bytes, blob: str | None = None) -> dict:
    import hashlib

    return {"path": path, "blob": blob or f"{VICTIM}/data/000002-forged/x", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "mtimeNs": 1}


class TestManifestPaths:
    @pytest.mark.parametrize(("path", "reason"), [
        ("../../escaped.txt", "has a '..' segment (it would leave the checkpoint folder)"),
        ("ok/../../escaped.txt", "has a '..' segment"),
        ("/tmp/amlhpc-escaped.txt", "is absolute"),
        ("C:/escaped.txt", "is absolute"),
        ("a\\..\\..\\escaped.txt", "holds a NUL or a backslash"),
        ("a//b", "has an empty or '.' segment"),
    ])
    def test_a_path_outside_the_folder_is_refused(self, container, tmp_path, path, reason):
        data = b"written by another job"
        forge(container, [entry("model.pt", b"fine"), entry(path, data)],
              {f"{VICTIM}/data/000002-forged/x": data})
        target = tmp_path / "node" / "ckpt"
        with pytest.raises(UnsafeCheckpoint) as info:
            CheckpointStore(container, VICTIM).restore(target)
        assert reason in str(info.value) and "another job wrote into this run's prefix" in str(info.value)
        assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/amlhpc-escaped.txt").exists()
        assert not target.exists() or not any(target.rglob("*")), "nothing of a refused version is written"

    def test_a_symlink_that_leads_out_is_refused(self, container, tmp_path):
        """The node's folder holds a link (left by the job itself, or a tar): a restore never writes through it."""
        outside = tmp_path / "outside"
        outside.mkdir()
        target = tmp_path / "ckpt"
        target.mkdir()
        (target / "sub").symlink_to(outside)
        forge(container, [entry("sub/model.pt", b"x")], {f"{VICTIM}/data/000002-forged/x": b"x"})
        with pytest.raises(UnsafeCheckpoint, match="resolves to .*outside .*a symlink on the way leads out"):
            CheckpointStore(container, VICTIM).restore(target)
        assert list(outside.iterdir()) == []

    def test_a_blob_of_another_stream_is_refused(self, container, tmp_path):
        forge(container, [entry("model.pt", b"x", blob="someone-else/data/000001/model.pt")], {})
        with pytest.raises(UnsafeCheckpoint, match="outside this stream's data folder 'victim-run/data/'"):
            CheckpointStore(container, VICTIM).restore(tmp_path / "ckpt")


class Payload:
    """What an attacker pickles: unpickling it would create `marker` (any code could run instead)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


class TestPicklePayloads:
    def test_a_whole_file_checkpoint_with_a_payload(self, container, tmp_path):
        """The launcher restores the bytes (they are only data to it); the training's load refuses them."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import safeload

        marker = tmp_path / "payload-ran"
        evil = tmp_path / "evil"
        evil.mkdir()
        torch.save({"model": {"w": torch.zeros(2)}, "hook": Payload(marker)}, evil / "ckpt-000000100.pt")
        assert not marker.exists()
        CheckpointStore(container, VICTIM).upload(evil)  # the attacking job, into the victim's prefix
        restored = tmp_path / "victim-node"
        CheckpointStore(container, VICTIM).restore(restored)
        with pytest.raises(UnsafeCheckpoint) as info:
            safeload.load_file(restored / "ckpt-000000100.pt")
        assert "weights_only refused it: it refers to" in str(info.value) and "nothing in it was run" in str(info.value)
        assert "two options" not in str(info.value), "never pass on torch's advice to load it unsafely"
        assert not marker.exists()

    def test_dcp_metadata_with_a_payload(self, tmp_path):
        """DCP's own reader would pickle.load `.metadata`; ours refuses the global and names it."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import tier
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        marker = tmp_path / "payload-ran"
        Checkpointer(tmp_path / "ckpt", 0, 1, "t", background=False).save(5, {"w": torch.ones(3)}, {"step": 5})
        version = tier.versions_dir(tmp_path / "ckpt") / "step-000000005"
        (version / "rank-0" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
        with pytest.raises(UnsafeCheckpoint) as info:
            load_version(version, {"w": torch.zeros(3)}, 0)
        assert "refers to io.open" in str(info.value) or "refers to builtins.open" in str(info.value)
        assert "nothing in it was run" in str(info.value)
        assert not marker.exists()

    def test_dcp_value_with_a_payload(self, tmp_path):
        """A non-tensor value is a torch.save pickle inside the shard: read with weights_only."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import tier
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        marker = tmp_path / "payload-ran"
        Checkpointer(tmp_path / "ckpt", 0, 1, "t", background=False).save(
            5, {"w": torch.ones(3), "hook": Payload(marker)}, {"step": 5})
        assert not marker.exists()
        version = tier.versions_dir(tmp_path / "ckpt") / "step-000000005"
        with pytest.raises(UnsafeCheckpoint, match="checkpoint value hook is not plain data .weights_only refused it: it refers to (io|builtins).open"):
            load_version(version, {"w": torch.zeros(3), "hook": None}, 0)
        assert not marker.exists()

    def test_dcp_metadata_naming_a_file_outside_the_rank_folder(self, tmp_path):
        torch = pytest.importorskip("torch")
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        from amlhpc.jobs.runtime.checkpoint import safeload, tier
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer

        Checkpointer(tmp_path / "ckpt", 0, 1, "t", background=False).save(5, {"w": torch.ones(3)}, {"step": 5})
        path = tier.versions_dir(tmp_path / "ckpt") / "step-000000005" / "rank-0" / ".metadata"
        metadata = safeload.read_metadata(path)
        for key, info in list(metadata.storage_data.items()):
            metadata.storage_data[key] = _StorageInfo("../../../../etc/passwd", info.offset, info.length)
        path.write_bytes(pickle.dumps(metadata))
        with pytest.raises(UnsafeCheckpoint, match="'..' segment"):
            safeload.read_metadata(path)

    def test_a_legitimate_version_still_loads(self, tmp_path):
        """The allow-list is exactly what DCP writes: model, optimizer and plain values round-trip."""
        torch = pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import tier
        from amlhpc.jobs.runtime.checkpoint.versioned import Checkpointer, load_version

        model = torch.nn.Linear(3, 2)
        optim = torch.optim.AdamW(model.parameters())
        model(torch.ones(1, 3)).sum().backward()
        optim.step()
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "note": {"lr": 0.1, "tags": ["a"]}}
        Checkpointer(tmp_path / "ckpt", 0, 1, "t", background=False).save(7, state, {"step": 7})
        fresh = torch.nn.Linear(3, 2)
        target = {"model": fresh.state_dict(), "optim": torch.optim.AdamW(fresh.parameters()).state_dict(),
                  "note": {"lr": 0.0, "tags": []}}
        os.environ.pop("AMLHPC_RESUME_VERSION", None)
        trainer = load_version(tier.versions_dir(tmp_path / "ckpt") / "step-000000007", target, 0)
        assert trainer["step"] == 7 and trainer["same_world"]
        assert torch.equal(target["model"]["weight"], model.state_dict()["weight"])
        assert target["note"] == {"lr": 0.1, "tags": ["a"]}


def _text(value: str) -> bytes:
    """SHORT_BINUNICODE: a string on the pickle stack."""
    data = value.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL


def _set_attribute(target: bytes, attribute: str, value: bytes) -> bytes:
    """Protocol 4: `target`, then BUILD with (None, {attribute: value}): pickle's BUILD calls
    setattr(target, attribute, value) for the second half of such a state."""
    return b"\x80\x04" + target + b"N}" + _text(attribute) + value + b"s\x86b."


_META = "torch.distributed.checkpoint.metadata"
FORGED_METADATA = {
    # the four a red team had accepted by the find_class-only unpickler, each patching the process
    "PosixPath.__fspath__": _set_attribute(_global("pathlib", "PosixPath"), "__fspath__",
                                           _global("torch.serialization", "_get_layout")),
    "Metadata.version": _set_attribute(_global(_META, "Metadata"), "version", _text("forged")),
    "_get_layout.cache": _set_attribute(_global("torch.serialization", "_get_layout"), "cache",
                                        b"}" + _text("torch.strided") + _text("forged") + b"s"),
    "PurePosixPath.__truediv__": _set_attribute(_global("pathlib", "PurePosixPath"), "__truediv__",
                                                _global("pathlib", "PosixPath")),
    # a fresh record with an attribute no DCP record has
    "Metadata.__class__": b"\x80\x04" + _global(_META, "Metadata") + b")\x81}" + _text("__class__")
                          + _global("pathlib", "PosixPath") + b"sb.",
    # an allow-listed class called with arguments, an instance of a class that is no record
    "Metadata(...)": b"\x80\x04" + _global(_META, "Metadata") + _text("x") + b"\x85R.",
    "PosixPath.__new__": b"\x80\x04" + _global("pathlib", "PosixPath") + b")\x81.",
    "os.system": b"\x80\x04" + _global("os", "system") + _text("true") + b"\x85R.",
}


def _fingerprint():
    """What a forged file could patch: the allow-listed classes and functions and layout cache."""
    import pathlib

    import torch.serialization
    from torch.distributed.checkpoint import filesystem, metadata

    targets = [pathlib.PosixPath, pathlib.PurePosixPath, pathlib.PurePath, pathlib.Path, torch.Size,
               torch.serialization._get_layout, filesystem._StorageInfo, metadata._MEM_FORMAT_ENCODING,
               *(getattr(metadata, n) for n in ("Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
                                                 "BytesStorageMetadata", "TensorProperties", "MetadataIndex",
                                                 "StorageMeta"))]
    return {t: dict(vars(t)) for t in targets}, dict(torch.serialization._get_layout.cache)


def _same(a, b) -> bool:
    """Two fingerprints hold the very same objects (identity, not equality)."""
    return (a[1] == b[1] and a[0].keys() == b[0].keys()
            and all({k: id(v) for k, v in a[0][t].items()} == {k: id(v) for k, v in b[0][t].items()} for t in a[0]))


class TestForgedMetadataBuild:
    """BUILD as pickle defines it sets attributes on whatever the stack holds; DCP metadata is read by
    an unpickler that fills only records it just made, with their own fields."""

    @pytest.mark.parametrize("name", sorted(FORGED_METADATA))
    def test_forged_metadata_is_refused_and_leaves_no_trace(self, tmp_path, name):
        pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import safeload

        path = tmp_path / ".metadata"
        path.write_bytes(FORGED_METADATA[name])
        before = _fingerprint()
        try:
            with pytest.raises(UnsafeCheckpoint) as info:
                safeload.read_metadata(path)
            assert "nothing in it was run or changed" in str(info.value)
            assert _same(_fingerprint(), before), f"{name}: the forged file changed the process"
        finally:
            _undo(before)

    def test_each_opcode_outside_metadata_is_named(self, tmp_path):
        pytest.importorskip("torch")
        from amlhpc.jobs.runtime.checkpoint import safeload

        path = tmp_path / ".metadata"
        path.write_bytes(b"\x80\x04" + _global("os", "getcwd") + b")R.")
        with pytest.raises(UnsafeCheckpoint, match="refers to os.getcwd"):
            safeload.read_metadata(path)
        path.write_bytes(b"\x80\x04" + b"\x82\x01.")  # EXT1: the copyreg extension registry
        with pytest.raises(UnsafeCheckpoint, match="uses the pickle opcode EXT1"):
            safeload.read_metadata(path)


def _undo(before) -> None:
    """Put back whatever a regression let a forged file patch, so later tests run in a sound process."""
    import torch.serialization

    state, cache = before
    for target, saved in state.items():
        for key in set(vars(target)) - set(saved):
            try:
                delattr(target, key)
            except (AttributeError, TypeError):
                pass
        for key, value in saved.items():
            if vars(target).get(key) is not value:
                try:
                    setattr(target, key, value)
                except (AttributeError, TypeError):
                    pass
    torch.serialization._get_layout.cache.clear()
    torch.serialization._get_layout.cache.update(cache)
