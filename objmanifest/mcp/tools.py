"""What the MCP tools do, independent of the MCP SDK: one agent's ``Session`` on a task.

A model calling tools must not be trusted with what a process boundary hides from a shell
step: epochs (it could confuse them), leases (it thinks for minutes), paths (it could name
any file of the machine) and sizes (it could ask for gigabytes inline). So the session
keeps each claim it made, renews its lease in the background on the runtime's scheduler,
releases it (no retry spent) once held for ``max_hold`` seconds and says so on the next
call, confines every local path to ``root``, and bounds inline content to 1 MiB of UTF-8.

Every tool call returns a ``Reply``: the result, or the error as the CLI reports it with
``--json`` (its name, message and exit code) and what to do next; never an exception.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import objmanifest as om
from objmanifest.core.runtime import Repeating
from objmanifest.wire.polling import poll

from ..core.names import check_file_id
from ..wire.errors import NothingClaimable
from ..wire.exits import ExitCode, classify
from ..wire.shapes import claim_json, entry_json, error_json, record_json, status_json

R = TypeVar("R")

log = logging.getLogger(__name__)

MAX_INLINE = 1024 * 1024
"""The most bytes of UTF-8 text ``put`` takes and ``consume`` returns inline."""

MAX_WAIT = 60.0
"""The longest a ``claim`` or ``consume`` may wait for work, so a call returns."""

MAX_HOLD = 900.0
"""How long a claim is held (its lease renewed) by default before it is released."""

LOG_LIMIT = 100
"""Journal records ``log`` returns by default (the newest); at most ``MAX_LOG``."""
MAX_LOG = 1000

NEXT_STEP: dict[ExitCode, str] = {
    ExitCode.USAGE: "Fix the argument the message names and call the tool again.",
    ExitCode.NOTHING_CLAIMABLE: (
        "Nothing to do for now: call claim again later (with wait= to poll), claim "
        "another stage, or call status to see what is pending and why."
    ),
    ExitCode.NOT_READY: (
        "Its producer has not made it ready yet: call consume again later, or with wait=."
    ),
    ExitCode.LEASE_LOST: (
        "Stop working on this file: you no longer hold it (another agent took it over, or "
        "it was released). Claim another file, or claim this one again if it is still pending."
    ),
    ExitCode.CHECKSUM_MISMATCH: (
        "The data was damaged; the entry was sent back to be produced again. Do not use what "
        "you read; consume it again once it is ready."
    ),
    ExitCode.CONFLICT_RETRIES_EXHAUSTED: "Many agents write at once: call the tool again.",
    ExitCode.NOT_FOUND: (
        "Check the file id or stage (call status for the stages and counts); declare the "
        "file first if it should exist."
    ),
    ExitCode.ALREADY_EXISTS: (
        "It exists with other settings; use it as it is or choose another file id."
    ),
    ExitCode.ALREADY_CONSUMED: "You consumed it before; there is nothing more to do with it.",
    ExitCode.NOT_A_CONSUMER: "This file is meant for other roles; leave it to them.",
    ExitCode.UNSUPPORTED: "Not something this agent can fix: report it to a human operator.",
    ExitCode.STORE_ERROR: (
        "The store did not answer as it should (network, credentials, permissions): try "
        "again in a moment, and report it if it persists."
    ),
    ExitCode.REFUSED: "The entry is not in a state that allows this; call show to see it.",
    ExitCode.ERROR: "Report this to a human operator if calling again does not help.",
}


def confine(root: Path, given: str, what: str) -> Path:
    """``given`` (relative to ``root``, or absolute) as a resolved path inside ``root``.

    ``..`` is refused outright, and symlinks are resolved before the check, so neither a
    path nor a link in it can lead outside the root. ``root`` is resolved already.
    """
    if not isinstance(given, str) or not given.strip():
        raise om.InvalidInput(f"{what} is empty: give a path inside {root}")
    if "\x00" in given:
        raise om.InvalidInput(f"{what} {given!r} contains a NUL character")
    path = Path(given)
    if ".." in path.parts:
        raise om.InvalidInput(
            f"{what} {given!r} contains '..': give a path inside {root} without '..'"
        )
    full = path if path.is_absolute() else root / path
    try:
        resolved = full.resolve(strict=True)
    except FileNotFoundError:  # a path to be written: its missing tail resolves as given
        resolved = full.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before 3.13)
        raise om.InvalidInput(f"{what} {given!r} cannot be resolved: {e}") from None
    if resolved != root and not resolved.is_relative_to(root):
        via = "" if resolved == full else f" (a symlink leads it to {resolved})"
        raise om.InvalidInput(
            f"{what} {given!r} is outside the root {root}{via}: this server reads and writes "
            "files only inside its --root"
        )
    return resolved


def check_root(root: str | os.PathLike[str]) -> Path:
    """``--root``: an existing directory, resolved."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise om.InvalidInput(f"--root {str(root)!r} is not a directory: give an existing one")
    return path.resolve()


def inline_text(text: str) -> bytes:
    """``put``'s inline ``text`` as the bytes stored (UTF-8), within ``MAX_INLINE``."""
    data = text.encode("utf-8", errors="strict")
    if len(data) > MAX_INLINE:
        raise om.InvalidInput(
            f"text is {len(data)} bytes of UTF-8, more than the {MAX_INLINE} inline: write it to "
            "a file under the root and put it with path="
        )
    return data


@dataclass
class Reply:
    """One tool call's answer: ``data`` is the result, or the error if ``error`` is set."""

    data: dict[str, Any]
    error: bool = False


@dataclass
class _Held:
    """A claim this session holds: when it was made (the runtime's monotonic clock), the
    background job that renews it, and how many tool calls are using it right now."""

    claim: om.Claim
    since: float
    job: Repeating | None = None
    busy: int = 0


@dataclass
class Session:
    """One agent on one task, as an MCP server gives it to a model.

    Thread-safe: the SDK runs each tool call in a worker thread, and the renewals run on
    background jobs. The lock guards only the session's own state, never a request.
    """

    task: om.Task
    agent: om.Agent
    root: Path
    max_hold: float = MAX_HOLD
    _held: dict[str, _Held] = field(default_factory=dict, repr=False)
    _gone: dict[str, str] = field(default_factory=dict, repr=False)
    """File ids this session held and no longer does, with why (for ``LeaseLost``)."""
    _notices: list[str] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.max_hold > 0:
            raise om.InvalidInput(f"--max-hold must be above 0 seconds, not {self.max_hold}")

    @property
    def runtime(self) -> om.Runtime:
        return self.task.store.runtime

    @property
    def interval(self) -> float:
        """How often a held claim is looked after: a third of the lease, as ``put`` renews,
        or the hold itself if that is shorter."""
        return max(0.05, min(self.task.lease_seconds / 3, self.max_hold))

    # -- running a tool ----------------------------------------------------------------

    def run(self, op: Callable[[], dict[str, Any]]) -> Reply:
        """Call ``op``; its result, or its error as the CLI names it, with the notices."""
        self._release_overdue()
        try:
            data, failed = op(), False
        except Exception as e:  # every error is the tool's answer, never the server's end
            if classify(e).label == "unexpected error":
                log.exception("a tool call failed unexpectedly")
            data, failed = error_json(e), True
            data["next_step"] = NEXT_STEP.get(
                ExitCode(data["exit_code"]), NEXT_STEP[ExitCode.ERROR]
            )
        with self._lock:
            notices, self._notices = self._notices, []
        if notices:
            data["notices"] = notices
        return Reply(data, failed)

    # -- holding claims ----------------------------------------------------------------

    def _hold(self, claim: om.Claim) -> None:
        """Keep ``claim`` and start renewing it."""
        held = _Held(claim, self.runtime.monotonic())
        with self._lock:
            self._gone.pop(claim.file_id, None)
            self._held[claim.file_id] = held
        job = self.runtime.every(lambda: self._tend(held), self.interval, f"mcp-{claim.file_id}")
        with self._lock:
            if self._held.get(claim.file_id) is held:
                held.job = job
                return
        job.stop()  # let go of already (a tool call that finished first)

    def _take(self, file_id: str) -> _Held:
        """The held claim on ``file_id``, marked busy (``_done`` unmarks it); ``LeaseLost``
        if this session held it and lost it, ``InvalidInput`` if it never held it."""
        check_file_id(file_id)
        with self._lock:
            held = self._held.get(file_id)
            if held is not None:
                held.busy += 1
                return held
            gone = self._gone.get(file_id)
        if gone is not None:
            raise om.LeaseLost(gone)
        raise om.InvalidInput(
            f"agent {self.agent.name!r} holds no claim on {file_id!r} in this server: call "
            "claim with it first (claims are kept per server process)"
        )

    def _done(self, held: _Held) -> None:
        with self._lock:
            held.busy -= 1

    def _drop(self, held: _Held, why: str | None = None) -> None:
        """Stop holding ``held`` (``why``: what later calls on it are told)."""
        file_id = held.claim.file_id
        with self._lock:
            if self._held.get(file_id) is held:
                del self._held[file_id]
            if why is not None:
                self._gone[file_id] = why
            job = held.job
        if job is not None:
            job.stop()

    def _tend(self, held: _Held) -> bool:
        """A background round for one claim: release it once held ``max_hold`` seconds,
        else renew its lease. False ends the job (the claim is no longer held).

        A job never stops another job (stopping one waits for its thread): a claim let go
        of elsewhere ends its job at the job's next round, here."""
        if not self._holds(held):
            return False
        if self._overdue(held):
            self._release_overdue()  # unless a tool call is using it: then renew it still
            if not self._holds(held):
                return False
        try:
            renewed = self.agent.renew(held.claim)
        except om.LeaseLost as e:
            self._lose(held, e)
            return False
        except om.ObjManifestError as e:  # a passing store fault: the next round tries again
            log.warning("renewing the lease on %r failed, will retry: %s", held.claim.file_id, e)
            return True
        with self._lock:
            held.claim = renewed
        return True

    def _holds(self, held: _Held) -> bool:
        with self._lock:
            return self._held.get(held.claim.file_id) is held

    def _overdue(self, held: _Held) -> bool:
        return self.runtime.monotonic() - held.since >= self.max_hold

    def _lose(self, held: _Held, error: om.LeaseLost) -> None:
        """Its job found the claim fenced: let go of it (the job ends on its own)."""
        file_id = held.claim.file_id
        with self._lock:
            if self._held.get(file_id) is not held:
                return  # let go of already, by a tool call or the hold
            del self._held[file_id]
            self._gone[file_id] = str(error)
            self._notices.append(f"lost the lease on {file_id!r}: {error}")

    def _release_overdue(self) -> None:
        """Release every claim held ``max_hold`` seconds or more, unless a tool call is
        using it right now (then it goes once that call ends, at its next look)."""
        with self._lock:
            due = [h for h in self._held.values() if h.busy == 0 and self._overdue(h)]
            for held in due:
                del self._held[held.claim.file_id]
        for held in due:  # their jobs end at their next round (see _tend)
            file_id = held.claim.file_id
            hold = f"{self.max_hold:g}s"
            try:
                self.agent.release(held.claim)
            except om.LeaseLost as e:
                why = f"lost the lease on {file_id!r} before its hold of {hold} ended: {e}"
            except om.ObjManifestError as e:
                why = (
                    f"stopped holding {file_id!r} after {hold} (--max-hold); releasing it failed "
                    f"({e}), so its lease runs out and another agent takes it over"
                )
            else:
                why = (
                    f"released {file_id!r} after holding it {hold} (--max-hold), no retry spent: "
                    "it is pending again for any agent. Claim it again to go on with it"
                )
            with self._lock:
                self._gone[file_id] = why
                self._notices.append(why)

    def held(self) -> list[dict[str, Any]]:
        """The claims this session holds, each with the seconds left of its hold."""
        now = self.runtime.monotonic()
        with self._lock:
            items = list(self._held.values())
        return [
            {**claim_json(h.claim), "hold_seconds_left": round(self.max_hold - (now - h.since), 1)}
            for h in items
        ]

    def close(self) -> list[str]:
        """Stop renewing, and release every claim still held (the model is gone: its work
        on them will not be finished). Returns the file ids released."""
        with self._lock:
            items, self._held = list(self._held.values()), {}
        released = []
        for held in items:
            if held.job is not None:
                held.job.stop()
            try:
                self.agent.release(held.claim)
            except om.ObjManifestError as e:
                log.warning("could not release %r on the way out: %s", held.claim.file_id, e)
            else:
                released.append(held.claim.file_id)
        return released

    def _claimed(self, claim: om.Claim) -> dict[str, Any]:
        self._hold(claim)
        return {
            **claim_json(claim),
            "hold_seconds": self.max_hold,
            "note": (
                f"you hold {claim.file_id!r}: its lease is renewed for you for up to "
                f"{self.max_hold:g}s; then put its data, fail or release it"
            ),
        }

    # -- the tools ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        data = status_json(self.task.status())
        data["agent"] = self.agent.name
        data["role"] = self.agent.role
        data["held"] = self.held()
        return data

    def show(self, file_id: str) -> dict[str, Any]:
        return entry_json(self.task.entry(file_id))

    def declare(
        self,
        file_id: str,
        stage: str,
        depends_on: list[str] | None = None,
        consumers: list[str] | None = None,
    ) -> dict[str, Any]:
        entry = self.task.declare(file_id, stage, depends_on or (), consumers or ())
        return entry_json(entry)

    def claim(
        self, file_id: str | None = None, stage: str | None = None, wait: float = 0.0
    ) -> dict[str, Any]:
        wait = _wait(wait)
        if file_id is None and stage is None:
            raise om.InvalidInput("claim needs file_id (one file) or stage (any file of it)")
        if file_id is not None:
            with self._lock:
                held = self._held.get(file_id)
            if held is not None:
                return {**self._claimed_again(held)}
            claim = poll(lambda: self.agent.claim(file_id, stage=stage), wait, (om.NotClaimable,))
            assert claim is not None
            return self._claimed(claim)
        assert stage is not None
        found = poll(lambda: self.agent.claim(stage=stage), wait)
        if found is None:
            waited = f" after waiting {wait:g}s" if wait else ""
            if not self.task.shard(stage).entries:
                raise NothingClaimable(
                    f"stage {stage!r} has no entries{waited}: declare some first"
                )
            raise NothingClaimable(
                f"no entry of stage {stage!r} is claimable{waited}: {self.task.unclaimable(stage)}"
            )
        return self._claimed(found)

    def _with_claim(self, file_id: str, call: Callable[[om.Claim], R]) -> tuple[_Held, R]:
        """``call`` on the held claim of ``file_id``, marked busy meanwhile; a claim found
        lost (``LeaseLost``) stops being held, and what happened is told on later calls."""
        held = self._take(file_id)
        try:
            return held, call(held.claim)
        except om.LeaseLost as e:
            self._drop(held, str(e))
            raise
        finally:
            self._done(held)

    def _hold_left(self, held: _Held) -> float:
        return self.max_hold - (self.runtime.monotonic() - held.since)

    def _claimed_again(self, held: _Held) -> dict[str, Any]:
        left = self._hold_left(held)
        return {
            **claim_json(held.claim),
            "hold_seconds": round(left, 1),
            "note": f"you hold {held.claim.file_id!r} already ({left:.0f}s of its hold left)",
        }

    def put(self, file_id: str, path: str | None = None, text: str | None = None) -> dict[str, Any]:
        if (path is None) == (text is None):
            raise om.InvalidInput("put needs exactly one of path (a file under the root) or text")
        data: bytes | Path
        if text is not None:
            data = inline_text(text)
        else:
            assert path is not None
            data = confine(self.root, path, "path")
            if data.is_dir():
                raise om.InvalidInput(f"path {path!r} is a directory: put one file")
            if not data.is_file():
                raise om.InvalidInput(f"path {path!r} is not a file under the root {self.root}")
        held, entry = self._with_claim(file_id, lambda claim: self.agent.put(claim, data))
        self._drop(held)
        return entry_json(entry)

    def renew(self, file_id: str) -> dict[str, Any]:
        held, renewed = self._with_claim(file_id, self.agent.renew)
        with self._lock:
            held.claim = renewed
        left = self._hold_left(held)
        return {
            **claim_json(renewed),
            "hold_seconds": round(left, 1),
            "note": f"lease renewed; {left:.0f}s of the hold on {file_id!r} left",
        }

    def fail(self, file_id: str, reason: str) -> dict[str, Any]:
        held, entry = self._with_claim(file_id, lambda claim: self.agent.fail(claim, reason))
        self._drop(held, f"you gave {file_id!r} up (fail); claim it again to retry it")
        return entry_json(entry)

    def release(self, file_id: str) -> dict[str, Any]:
        held, entry = self._with_claim(file_id, self.agent.release)
        self._drop(held, f"you released {file_id!r}; claim it again to work on it")
        return entry_json(entry)

    def consume(self, file_id: str, path: str | None = None, wait: float = 0.0) -> dict[str, Any]:
        wait = _wait(wait)
        check_file_id(file_id)
        if path is not None:
            dest = confine(self.root, path, "path")
            if dest.exists() and not dest.is_file():
                # A FIFO would block the call until something reads it, a device is no
                # place for an agent's file, and a directory is refused anyway.
                kind = "a directory" if dest.is_dir() else "not a regular file (a FIFO or a device)"
                raise om.InvalidInput(
                    f"path {path!r} is {kind}: consume into a regular file under the root "
                    f"{self.root}, or a new one; nothing was consumed"
                )
            entry = poll(lambda: self.agent.consume(file_id, dest), wait, (om.NotReady,))
            assert entry is not None
            return {**entry_json(entry), "path": str(dest)}

        def inline() -> bytes:
            size = self.task.entry(file_id).size
            if size is not None and size > MAX_INLINE:
                raise om.InvalidInput(
                    f"{file_id!r} is {size} bytes, more than the {MAX_INLINE} returned inline: "
                    "consume it with path= (a file under the root) instead; nothing was consumed"
                )
            return self.agent.consume(file_id)

        data = poll(inline, wait, (om.NotReady,))
        assert data is not None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise om.InvalidInput(
                f"{file_id!r} is not UTF-8 text ({e.reason} at byte {e.start}), so it cannot be "
                "returned inline. It was verified and marked consumed: consume it again with "
                "path= (a file under the root) to get its bytes"
            ) from None
        return {**entry_json(self.task.entry(file_id)), "text": text}

    def log(self, file_id: str | None = None, limit: int = LOG_LIMIT) -> dict[str, Any]:
        if not 1 <= limit <= MAX_LOG:
            raise om.InvalidInput(f"limit must be from 1 to {MAX_LOG}, not {limit}")
        if file_id is not None:
            steps = self.task.history(file_id)
            return {
                "file_id": file_id,
                "history": [t.to_dict() for t in steps[-limit:]],
                "total": len(steps),
            }
        records = self.task.log()
        return {"records": [record_json(r) for r in records[-limit:]], "total": len(records)}

    def lineage(self, file_id: str) -> dict[str, Any]:
        return self.task.lineage(file_id).to_dict()


def _wait(wait: float) -> float:
    if not 0 <= wait <= MAX_WAIT:
        raise om.InvalidInput(f"wait must be from 0 to {MAX_WAIT:g} seconds, not {wait}")
    return float(wait)


__all__ = ["MAX_HOLD", "MAX_INLINE", "Reply", "Session", "check_root", "confine", "inline_text"]
