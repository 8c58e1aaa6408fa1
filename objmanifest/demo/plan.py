"""What the demo pipeline makes: file ids, dependencies, and the exact bytes of every file.

Everything here is deterministic and free of I/O, so the workers that produce the files and
the checks that verify them agree without talking to each other: a checker can recompute
what a dependency must have held and so prove that its producer read the finished data.

Output files of the ``write`` and ``check`` stages start with one JSON header line naming
the agent and epoch that made them and the SHA-256 of every input they read.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InvalidInput

STAGES = ("collect", "write", "check")
SEED = "objmanifest-demo-v1"
GROUP = 3
"""Collected files per write batch: each batch depends on several collect entries."""
PART_KIB = (64, 96, 128, 160)
"""Sizes of the collected files, cycled so they are not all alike."""
ARCHIVE = "out/archive.bin"
BLOCK = 1024 * 1024
ARCHIVE_HEADER = 4096
"""Bytes of the archive's header line, padded, so its total size is a whole number of MiB."""
MiB = 1024 * 1024

# Roles: a role is a named consumer; each entry is consumed once per role (broadcast).
WRITER, CHECKER, AUDITOR = "writer", "checker", "auditor"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Plan:
    """The files of one demo run and how they depend on each other."""

    files: int
    big_mib: int

    def __post_init__(self) -> None:
        if self.files < GROUP:
            raise InvalidInput(f"the demo needs at least {GROUP} files, not {self.files}")
        if self.big_mib < 1:
            raise InvalidInput(f"the large file needs at least 1 MiB, not {self.big_mib}")

    @property
    def parts(self) -> list[str]:
        return [f"raw/part-{i:03d}" for i in range(self.files)]

    @property
    def batches(self) -> dict[str, tuple[str, ...]]:
        """Write entries made from small groups of collected files."""
        parts = self.parts
        groups = [parts[i : i + GROUP] for i in range(0, len(parts), GROUP)]
        return {f"out/batch-{n:02d}": tuple(g) for n, g in enumerate(groups)}

    @property
    def victim_target(self) -> str:
        """The write entry the designated victim claims and dies holding."""
        return next(iter(self.batches))

    def depends_on(self, file_id: str) -> tuple[str, ...]:
        if file_id in self.batches:
            return self.batches[file_id]
        if file_id == ARCHIVE:
            return tuple(self.parts)
        if file_id.startswith("verdict/"):
            return (checked_by(file_id),)
        return ()

    @property
    def outputs(self) -> list[str]:
        return [*self.batches, ARCHIVE]

    @property
    def verdicts(self) -> list[str]:
        return [verdict_of(f) for f in self.outputs]

    def stage_of(self, file_id: str) -> str:
        if file_id.startswith("raw/"):
            return "collect"
        return "write" if file_id.startswith("out/") else "check"

    def declarations(self) -> list[dict[str, Any]]:
        """Every entry of the task. Writes and verdicts are broadcast to two roles each."""
        decls: list[dict[str, Any]] = []
        for fid in self.parts:
            decls.append(_decl(fid, "collect", (), (WRITER, AUDITOR)))
        for fid in self.outputs:
            decls.append(_decl(fid, "write", self.depends_on(fid), (CHECKER, AUDITOR)))
        for fid in self.verdicts:
            decls.append(_decl(fid, "check", self.depends_on(fid), (AUDITOR,)))
        return decls

    @property
    def all_ids(self) -> list[str]:
        return [*self.parts, *self.outputs, *self.verdicts]


def _decl(fid: str, stage: str, deps: tuple[str, ...], roles: tuple[str, ...]) -> dict[str, Any]:
    return {"file_id": fid, "stage": stage, "depends_on": deps, "consumers": roles}


def verdict_of(output: str) -> str:
    return "verdict/" + output.removeprefix("out/")


def checked_by(verdict: str) -> str:
    return "out/" + verdict.removeprefix("verdict/")


# -- content ---------------------------------------------------------------------------


def part_bytes(file_id: str) -> bytes:
    """What a collect worker stores for ``file_id``: seeded pseudo-random bytes."""
    index = int(file_id.rsplit("-", 1)[1])
    size = PART_KIB[index % len(PART_KIB)] * 1024
    return random.Random(f"{SEED}:{file_id}").randbytes(size)


def expected_input_digest(file_id: str) -> str:
    return sha256(part_bytes(file_id))


def filler_seed(inputs: dict[str, str]) -> str:
    """The archive's body depends on its inputs: change one and every byte changes."""
    return sha256(json.dumps(sorted(inputs.items())).encode())


def filler_blocks(seed: str, size: int) -> Iterator[bytes]:
    """The archive body, generated 1 MiB at a time so memory stays small at any size."""
    rng = random.Random(f"{SEED}:{seed}")
    left = size
    while left > 0:
        n = min(BLOCK, left)
        yield rng.randbytes(n)
        left -= n


def header_line(header: dict[str, Any], pad_to: int = 0) -> bytes:
    """One JSON line; padded with spaces (still valid JSON) to ``pad_to`` bytes if given."""
    line = json.dumps(header, sort_keys=True).encode()
    if pad_to and len(line) < pad_to:
        line += b" " * (pad_to - len(line) - 1)
    return line + b"\n"


def made_header(
    kind: str, file_id: str, agent: str, epoch: int, inputs: dict[str, bytes]
) -> dict[str, Any]:
    """The header of a file made from ``inputs``: what it is, who made it, and the digests
    of its inputs."""
    digests = {fid: sha256(data) for fid, data in inputs.items()}
    return {"kind": kind, "file_id": file_id, "agent": agent, "epoch": epoch, "inputs": digests}


def write_batch(path: Path, file_id: str, agent: str, epoch: int, inputs: dict[str, bytes]) -> None:
    """A batch: a header naming its inputs' digests, then the inputs concatenated."""
    with path.open("wb") as out:
        out.write(header_line(made_header("batch", file_id, agent, epoch, inputs)))
        for fid in sorted(inputs):
            out.write(inputs[fid])


def archive_body_size(total: int) -> int:
    """The body that makes the archive exactly ``total`` bytes, so it fills whole parts."""
    return max(0, total - ARCHIVE_HEADER)


def write_archive(path: Path, agent: str, epoch: int, inputs: dict[str, bytes], size: int) -> None:
    """The large artifact: a fixed-size header, then ``size`` bytes seeded by the inputs'
    digests."""
    header = made_header("archive", ARCHIVE, agent, epoch, inputs)
    header["body_size"] = size
    with path.open("wb") as out:
        out.write(header_line(header, pad_to=ARCHIVE_HEADER))
        for block in filler_blocks(filler_seed(header["inputs"]), size):
            out.write(block)


def write_verdict(
    path: Path,
    file_id: str,
    agent: str,
    epoch: int,
    checked: str,
    read: Inspected,
    problems: list[str],
    checked_epoch: int,
) -> None:
    verdict = {
        "kind": "verdict",
        "file_id": file_id,
        "agent": agent,
        "epoch": epoch,
        "checked": checked,
        "checked_epoch": checked_epoch,
        "input_sha256": read.file_sha256,
        "ok": not problems,
        "problems": problems,
    }
    path.write_bytes(header_line(verdict))


# -- reading outputs back --------------------------------------------------------------


@dataclass(frozen=True)
class Inspected:
    """A produced file as read back: its header, and digests of its body and whole bytes."""

    header: dict[str, Any]
    body_sha256: str
    body_size: int
    file_sha256: str


def inspect_file(path: Path) -> Inspected:
    with path.open("rb") as fh:
        return inspect_stream(fh)


def inspect_stream(stream: BinaryIO) -> Inspected:
    whole, body = hashlib.sha256(), hashlib.sha256()
    first = stream.readline()
    whole.update(first)
    try:
        header = json.loads(first)
    except ValueError:
        header = {}
    if not isinstance(header, dict):
        header = {}
    size = 0
    while block := stream.read(BLOCK):
        whole.update(block)
        body.update(block)
        size += len(block)
    return Inspected(header, body.hexdigest(), size, whole.hexdigest())


def _expected_body(kind: str, header: dict[str, Any], deps: tuple[str, ...]) -> tuple[str, int]:
    """SHA-256 and size the body of an output must have, computed from scratch."""
    digest = hashlib.sha256()
    size = 0
    if kind == "batch":
        blocks: Iterator[bytes] = (part_bytes(d) for d in sorted(deps))
    else:
        inputs = header.get("inputs") if isinstance(header.get("inputs"), dict) else {}
        body_size = header.get("body_size")
        blocks = filler_blocks(
            filler_seed(dict(inputs or {})), body_size if isinstance(body_size, int) else 0
        )
    for block in blocks:
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def check_output(
    file_id: str,
    deps: tuple[str, ...],
    read: Inspected,
    holder: tuple[str | None, int],
    big_size: int | None = None,
) -> list[str]:
    """What is wrong with a write-stage output, judged against its manifest entry.

    ``holder`` is the entry's (owner, epoch): the data must be the bytes that holder made,
    and its recorded input digests must equal what the finished inputs hold, which the
    writer could only have seen once they were ready.
    """
    h = read.header
    kind = "archive" if file_id == ARCHIVE else "batch"
    if h.get("kind") != kind or h.get("file_id") != file_id:
        return [f"{file_id}: header does not describe this file: {str(h)[:120]}"]
    problems: list[str] = []
    owner, epoch = holder
    if (h.get("agent"), h.get("epoch")) != (owner, epoch):
        problems.append(
            f"{file_id}: data was made by {h.get('agent')} at epoch {h.get('epoch')}, but the "
            f"manifest says {owner} at epoch {epoch} made it ready"
        )
    inputs = h.get("inputs") if isinstance(h.get("inputs"), dict) else {}
    assert isinstance(inputs, dict)
    if set(inputs) != set(deps):
        problems.append(
            f"{file_id}: inputs {sorted(inputs)} differ from dependencies {sorted(deps)}"
        )
    for dep in sorted(set(inputs) & set(deps)):
        if inputs[dep] != expected_input_digest(dep):
            problems.append(
                f"{file_id}: input {dep} was not the finished data (digest "
                f"{str(inputs[dep])[:12]}...)"
            )
    if kind == "archive" and big_size is not None and h.get("body_size") != big_size:
        problems.append(f"{file_id}: body size {h.get('body_size')} != {big_size}")
    want_sha, want_size = _expected_body(kind, h, deps)
    if (read.body_sha256, read.body_size) != (want_sha, want_size):
        problems.append(
            f"{file_id}: body ({read.body_size} bytes) differs from the expected {want_size} bytes"
        )
    return problems


def check_verdict(
    file_id: str, read: Inspected, holder: tuple[str | None, int], output_sha256: str | None
) -> list[str]:
    """What is wrong with a verdict, given the SHA-256 of the output it claims to check."""
    h = read.header
    checked = checked_by(file_id)
    if h.get("kind") != "verdict" or h.get("file_id") != file_id:
        return [f"{file_id}: not a verdict for this file: {str(h)[:120]}"]
    problems: list[str] = []
    if (h.get("agent"), h.get("epoch")) != holder:
        problems.append(
            f"{file_id}: made by {h.get('agent')} at epoch {h.get('epoch')}, "
            f"manifest says {holder[0]} at epoch {holder[1]}"
        )
    if h.get("checked") != checked:
        problems.append(f"{file_id}: checked {h.get('checked')} instead of {checked}")
    if h.get("ok") is not True:
        problems.append(f"{file_id}: the checker found problems: {h.get('problems')}")
    if output_sha256 is None or h.get("input_sha256") != output_sha256:
        problems.append(f"{file_id}: it read other bytes of {checked} than the finished ones")
    return problems
