"""One sequence of Blob operations, written once, run against Azurite (the real SDK) and the
simulated service (amlhpc.sim's clients): the answers must agree (tests/sim/test_sim_vs_azurite.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from azure.core import MatchConditions
from azure.storage.blob import BlobBlock, BlockState


class Recorder:
    """Outcomes of labelled steps, with ETags and lease ids renamed in order of appearance."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, Any]] = []
        self._etags: dict[str, str] = {}

    def etag(self, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip('"')
        return self._etags.setdefault(value, f"etag{len(self._etags)}")

    def __call__(self, label: str, fn: Callable[[], Any], shape: Callable[[Any], Any] = lambda value: None) -> Any:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
            code = getattr(exc, "error_code", None) or getattr(exc, "code", None)
            status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
            self.outcomes.append((label, ("error", type(exc).__name__, status,
                                          str(getattr(code, "value", code)) if code else None)))
            return None
        self.outcomes.append((label, ("ok", shape(value))))
        return value


def sequence(container, say: Recorder) -> None:
    """The operations (see the module docstring); `container` is a ContainerClient of either kind."""
    a = container.get_blob_client("dir/a.json")
    first = say("create", lambda: a.upload_blob(b"one", overwrite=False), lambda r: say.etag(r["etag"]))
    say("create again: If-None-Match *", lambda: a.upload_blob(b"two", overwrite=False))
    say("If-Match stale", lambda: a.upload_blob(b"two", overwrite=True, etag='"0x8D0000000000000"',
                                                match_condition=MatchConditions.IfNotModified))
    second = say("If-Match current", lambda: a.upload_blob(b"two", overwrite=True, etag=first["etag"],
                                                           match_condition=MatchConditions.IfNotModified),
                 lambda r: say.etag(r["etag"]))
    say("etag changed", lambda: first["etag"] != second["etag"], lambda v: v)
    say("IfMissing on existing", lambda: a.upload_blob(b"x", overwrite=True, match_condition=MatchConditions.IfMissing))
    say("read", lambda: a.download_blob().readall(), lambda v: v)
    say("read If-None-Match current", lambda: a.download_blob(etag=second["etag"],
                                                               match_condition=MatchConditions.IfModified).readall())
    say("read If-Match stale", lambda: a.download_blob(etag=first["etag"],
                                                        match_condition=MatchConditions.IfNotModified).readall())
    say("properties", lambda: a.get_blob_properties(), lambda p: (p.name, p.size, say.etag(p.etag), p.lease.state,
                                                                 p.lease.status))
    missing = container.get_blob_client("dir/missing")
    say("missing properties", lambda: missing.get_blob_properties())
    say("missing read", lambda: missing.download_blob())
    say("missing delete", lambda: missing.delete_blob())
    say("missing If-Match", lambda: missing.upload_blob(b"x", overwrite=True, etag=first["etag"],
                                                        match_condition=MatchConditions.IfNotModified))
    say("delete If-Match stale", lambda: a.delete_blob(etag=first["etag"], match_condition=MatchConditions.IfNotModified))
    say("metadata If-Match stale", lambda: a.set_blob_metadata({"k": "v"}, etag=first["etag"],
                                                               match_condition=MatchConditions.IfNotModified))
    third = say("metadata", lambda: a.set_blob_metadata({"k": "v"}), lambda r: say.etag(r["etag"]))
    say("metadata changes the etag", lambda: third["etag"] != second["etag"], lambda v: v)

    # leases
    lease = say("lease 15 s", lambda: a.acquire_lease(15), lambda lease: None)
    say("lease again, another id", lambda: a.acquire_lease(15, lease_id=str(uuid.UUID(int=7))))
    say("lease again, same id", lambda: a.acquire_lease(30, lease_id=lease.id), lambda lease: None)
    say("leased properties", lambda: a.get_blob_properties(), lambda p: (p.lease.state, p.lease.status, p.lease.duration))
    say("write without the lease", lambda: a.upload_blob(b"x", overwrite=True))
    say("write with another lease", lambda: a.upload_blob(b"x", overwrite=True, lease=str(uuid.UUID(int=9))))
    say("delete without the lease", lambda: a.delete_blob())
    say("write with the lease", lambda: a.upload_blob(b"leased", overwrite=True, lease=lease), lambda r: None)
    say("lease survives the write", lambda: a.get_blob_properties(), lambda p: p.lease.state)
    say("renew", lambda: lease.renew())
    say("read needs no lease", lambda: a.download_blob().readall(), lambda v: v)
    say("release", lambda: lease.release())
    say("release again", lambda: lease.release())
    say("the lease has no id after its release", lambda: lease.id, lambda v: v)
    say("write with a lease id no lease holds", lambda: a.upload_blob(b"x", overwrite=True, lease=str(uuid.UUID(int=5))))
    say("bad duration", lambda: a.acquire_lease(10))
    infinite = say("infinite lease", lambda: a.acquire_lease(-1), lambda lease: None)
    say("break at once", lambda: infinite.break_lease(0), lambda t: t)
    say("broken properties", lambda: a.get_blob_properties(), lambda p: (p.lease.state, p.lease.status))
    say("write after the break", lambda: a.upload_blob(b"after", overwrite=True), lambda r: None)
    say("lease after the break", lambda: a.acquire_lease(20), lambda lease: None)

    # blocks
    b = container.get_blob_client("dir/blocks.bin")
    say("stage 1", lambda: b.stage_block("blk-01", b"aa"))
    say("stage 2", lambda: b.stage_block("blk-02", b"bb"))
    say("a block id of another length", lambda: b.stage_block("blk-3", b"cc"))
    say("uncommitted is not listed", lambda: [p.name for p in container.list_blobs(name_starts_with="dir/blocks")],
        lambda v: v)
    say("uncommitted is not readable", lambda: b.download_blob())
    say("block list before", lambda: b.get_block_list("all"),
        lambda r: ([x.id for x in r[0]], sorted(x.id for x in r[1])))
    say("commit with a missing id", lambda: b.commit_block_list([BlobBlock("blk-01"), BlobBlock("blk-09")]))
    say("commit", lambda: b.commit_block_list([BlobBlock("blk-02"), BlobBlock("blk-01")]), lambda r: None)
    say("committed bytes", lambda: b.download_blob().readall(), lambda v: v)
    say("block list after", lambda: b.get_block_list("all"),
        lambda r: ([(x.id, x.size) for x in r[0]], [x.id for x in r[1]]))
    say("commit If-None-Match * on existing", lambda: b.commit_block_list([BlobBlock("blk-01")],
                                                                         match_condition=MatchConditions.IfMissing))
    say("recommit a committed block", lambda: b.commit_block_list([BlobBlock("blk-01", BlockState.COMMITTED)]), lambda r: None)
    say("recommitted bytes", lambda: b.download_blob().readall(), lambda v: v)

    # listing
    for i in range(12):
        container.upload_blob(f"list/{i:02d}/x", b"%d" % i, metadata={"i": str(i)} if i % 2 else None)
    container.upload_blob("list/top", b"t")
    say("list all", lambda: [(p.name, p.size) for p in container.list_blobs(name_starts_with="list/")], lambda v: v)
    say("list with metadata", lambda: [(p.name, p.metadata) for p in
                                       container.list_blobs(name_starts_with="list/0", include=["metadata"])], lambda v: v)
    say("list without metadata", lambda: [bool(p.metadata) for p in container.list_blobs(name_starts_with="list/0")],
        lambda v: v)
    say("list by 5", lambda: [p.name for p in container.list_blobs(name_starts_with="list/", results_per_page=5)],
        lambda v: v)
    say("walk", lambda: [p.name for p in container.walk_blobs(name_starts_with="list/", delimiter="/")], lambda v: v)
    say("list etag is the blob's", lambda: ({say.etag(p.etag) for p in container.list_blobs(name_starts_with="dir/a")}
                                             == {say.etag(a.get_blob_properties().etag)}), lambda v: v)

    say("ETag quoting: listing, properties, upload", lambda: (
        next(iter(container.list_blobs(name_starts_with="dir/a"))).etag.startswith('"'),
        a.get_blob_properties().etag.startswith('"'),
        container.upload_blob("dir/q", b"q").get_blob_properties().etag.startswith('"')), lambda v: v)

    # batches
    say("batch delete", lambda: [r.status_code for r in container.delete_blobs("list/00/x", "list/01/x")], lambda v: v)
    say("batch delete with a missing blob", lambda: list(container.delete_blobs("list/02/x", "list/none")))
    say("what the batch left", lambda: [p.name for p in container.list_blobs(name_starts_with="list/0")], lambda v: v)


def reader_sequence(container, reader, say: Recorder) -> None:
    """Staging's stdlib path (blobhttp.Reader): listing pages and markers, ranged reads, conditions."""
    from amlhpc.jobs.runtime.blob import listing

    for i in range(7):
        container.upload_blob(f"data/{i}.bin", bytes(range(i + 3)), metadata={"n": str(i)})

    def pages(include_metadata: bool) -> list[tuple[list[tuple[str, int, bytes]], bool]]:
        found, marker = [], None
        while True:
            entries, marker = listing.parse_page(reader.list_page("data/", marker, include_metadata=include_metadata,
                                                                  max_results=3))
            found.append(([(e.name, e.size, e.metadata) for e in entries], marker is not None))
            if not marker:
                return found
    say("pages of 3", lambda: pages(False), lambda v: v)
    say("pages with metadata", lambda: pages(True), lambda v: v)
    entries = listing.list_all(lambda marker: reader.list_page("data/", marker))
    say("listed etags are the blobs'", lambda: [say.etag(e.etag) for e in entries] ==
        [say.etag(container.get_blob_client(e.name).get_blob_properties().etag) for e in entries], lambda v: v)
    say("range", lambda: reader.get("data/5.bin", 2, 3, etag=entries[5].etag)[0], lambda v: v)
    say("range md5", lambda: reader.get("data/5.bin", 0, 4, range_md5=True)[1].get("Content-MD5"), lambda v: v)
    say("head metadata", lambda: reader.head("data/4.bin").get("x-ms-meta-n"), lambda v: v)
    container.upload_blob("data/5.bin", b"replaced", overwrite=True)
    say("range under a stale etag", lambda: reader.get("data/5.bin", 0, 2, etag=entries[5].etag),
        lambda v: v)
    say("missing", lambda: reader.get("data/none", 0, 1))
