"""Which checkpoint a managed run's attempt may restore.

Every job can write the checkpoints container, so `latest` and the manifests there are
claims, not facts. Before it creates an attempt, a managed run's controller checks each
pointer of the run's checkpoint (signed by one of the run's attempts, not behind a version it
already saw: amlhpc.jobs.managed.evidence) and hands the attempt what it checked, per stream:
the version and the SHA-256 of its manifest, taken from the signed pointer
(AMLHPC_RESTORE_PIN). The attempt then follows

- a pointer signed with its own key (this job committed it: after a requeue or an in-job
  restart) that is not older than the pinned version, or else
- the pinned version, whose manifest must hash to the pinned digest (Manifest.digest),

and nothing else: a pointer another job wrote, or an older one uploaded again, is named in
the log and passed over; with nothing pinned the attempt starts fresh. A stream the pin does
not name (a `per_node` writer's node-k folder stream, which the controller does not read: at
1,000 nodes its pins would not fit a job's environment) is followed only when this attempt or
one of the run's earlier attempts signed its pointer (their keys: AMLHPC_EARLIER_EVIDENCE_KEYS),
else that stream starts fresh; a replay of the run's own older pointer is not told apart there.
Outside managed runs (no evidence key, or no pin) every pointer is taken as found, its manifest
still checked against the digest the pointer carries.

Standard library only: ships in the image.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amlhpc.jobs.runtime.base import contract, jobid
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.coord import nodestatus

log = logging.getLogger("amlhpc.checkpoint")

MANIFEST_DIGEST = "manifestSha256"
"""The pointer's field holding its manifest's digest (Manifest.digest); signed with the pointer."""


@dataclass(frozen=True)
class Pin:
    """What the controller checked of one stream: the version to restore (None: none of the
    run's) and its manifest's digest (None: a pointer written before pointers carried one)."""

    version: str | None
    manifest_sha256: str | None = None

    def pointer(self) -> dict[str, Any] | None:
        """The pointer document this pin stands for."""
        if self.version is None:
            return None
        return {"version": self.version, **({MANIFEST_DIGEST: self.manifest_sha256} if self.manifest_sha256 else {})}


def pins_document(pins: Mapping[str, Pin]) -> dict[str, dict[str, str | None]]:
    """The pins as the controller's record keeps them: stream -> {"version", "manifestSha256"}."""
    return {stream: {"version": p.version, MANIFEST_DIGEST: p.manifest_sha256} for stream, p in sorted(pins.items())}


def pins_json(document: Mapping[str, dict[str, str | None]]) -> str:
    """The AMLHPC_RESTORE_PIN value: a pins_document as JSON."""
    return json.dumps(document, sort_keys=True)


def keys_json(keys: Mapping[str, str]) -> str:
    """The AMLHPC_EARLIER_EVIDENCE_KEYS value: job -> evidence key, as JSON."""
    return json.dumps(dict(keys), sort_keys=True)


def _controller_object(variable: str, what: str, text: str) -> dict[str, Any]:
    """A JSON object the controller wrote into a variable; CheckpointError naming the variable
    when it is not one (the controller wrote it, so a bad value is a bug or an edited job)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    except ValueError as exc:
        raise _edited(variable, what, exc) from None


def _edited(variable: str, what: str, why: object) -> CheckpointError:
    return CheckpointError(f"{variable} is not the controller's {what} ({why}): the job definition was edited; "
                           "submit the run again")


def parse_keys(text: str) -> dict[str, str]:
    """AMLHPC_EARLIER_EVIDENCE_KEYS read back (empty: none); CheckpointError naming the variable."""
    if not text.strip():
        return {}
    data = _controller_object(contract.EARLIER_KEYS, "list of keys", text)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise _edited(contract.EARLIER_KEYS, "list of keys", "not an object of job -> key")
    return data


def parse_pins(text: str) -> dict[str, Pin]:
    """AMLHPC_RESTORE_PIN read back; CheckpointError naming the variable when it is not what
    pins_json writes."""
    pins = {}
    for stream, pin in _controller_object(contract.RESTORE_PIN, "restore pin", text).items():
        fields = (pin.get("version"), pin.get(MANIFEST_DIGEST)) if isinstance(pin, dict) else None
        if fields is None or not all(v is None or isinstance(v, str) for v in fields):
            raise _edited(contract.RESTORE_PIN, "restore pin", f"stream {stream!r}: version and digest must be strings "
                                                               "or null")
        pins[stream.strip("/")] = Pin(*fields)
    return pins


@dataclass(frozen=True)
class RestoreTrust:
    """One stream's rule in a managed attempt (see the module docstring)."""

    stream: str
    pin: Pin
    attempt: str
    """This attempt's job id: the only signer whose pointers it follows beyond the pin."""
    key: str
    """This attempt's evidence key (hex)."""
    earlier: Mapping[str, str] | None = None
    """A stream the pin does not name: the run's earlier attempts' keys (job -> key), whose
    pointers are followed there besides this attempt's own; None: the stream is pinned."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], stream: str) -> RestoreTrust | None:
        """The rule for `stream`, None where pointers are taken as found (see the module docstring)."""
        key = (environ.get(contract.EVIDENCE_KEY) or "").strip()
        text = (environ.get(contract.RESTORE_PIN) or "").strip()
        if not key or not text:
            return None
        job = jobid.identify(environ).job_id
        pin = parse_pins(text).get(stream.strip("/"))
        if pin is None:
            return cls(stream.strip("/"), Pin(None), job, key, parse_keys(environ.get(contract.EARLIER_KEYS) or ""))
        return cls(stream.strip("/"), pin, job, key)

    def own(self, pointer: Mapping[str, Any]) -> str | None:
        """Why `pointer` is not this attempt's own, or None when this attempt signed it."""
        return nodestatus.check_pointer(lambda _job: self.key, (self.attempt,), pointer)

    def _of_the_run(self, pointer: Mapping[str, Any]) -> str | None:
        """Why `pointer` was signed by no attempt of the run that this attempt knows, or None."""
        keys = {**(self.earlier or {}), self.attempt: self.key}
        return nodestatus.check_pointer(keys.__getitem__, keys, pointer)

    def choose(self, pointer: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The pointer to follow: `pointer` itself when this attempt signed it and it is not
        older than the pin, else the pin's (None: start fresh); on a stream the pin does not
        name, `pointer` when an attempt of the run signed it, else none. What is passed over
        is logged."""
        if self.earlier is not None:
            if pointer is None:
                return None
            why = self._of_the_run(pointer)
            if why is None:
                return dict(pointer)
            log.warning("checkpoint pointer %s/latest (%s) passed over: %s; the controller does not pin this stream: "
                        "it starts fresh", self.stream, pointer.get("version"), why)
            return None
        pinned = self.pin.pointer()
        if pointer is None:
            return pinned
        why = self.own(pointer)
        version = str(pointer.get("version"))
        if why is None:
            if self.pin.version is None or sequence_of(version) >= sequence_of(self.pin.version):
                return dict(pointer)
            why = f"it names {version}, older than {self.pin.version} (uploaded again)"
        if pinned is not None and version == self.pin.version:
            return pinned  # the genuine pointer an earlier attempt signed: the pin carries its digest
        log.warning("checkpoint pointer %s/latest (%s) passed over: %s; %s", self.stream, version, why,
                    f"restoring {self.pin.version}, which the controller checked" if pinned
                    else "the controller found no checkpoint of this run: starting fresh")
        return pinned
