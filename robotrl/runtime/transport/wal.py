"""An append-only, fsynced log of accepted payloads: what the learner acknowledged since its last checkpoint.

Each record is framed as marker, payload length, CRC32 of the payload and CRC32 of those header fields, then
the payload bytes. `append` returns only once the record is on disk, so an acknowledgement sent after it
survives a SIGKILL or power loss. The learner empties the log once a checkpoint holding everything in it is
written.

Reading tells a crash from damage. A final frame cut short (a header checked but its payload running past the
end, a partial header, or zeros where a crash left the file grown but unwritten) was never acknowledged: it is
cut off. Anything else that does not check out (a payload or header checksum, no marker where a frame should
start) is damage to records that were acknowledged: the log is left as it is and `DamagedLogError` names the
file and the offset, unless the learner was told (`on_corruption="set_aside"`) to keep the file aside and go on
with its intact records. A payload that fails its checksum is skipped by its checked length, so every frame
after it is recovered; after a damaged header the next frame's start is unknown, and a search for the marker
could land on bytes inside a payload (actors choose those), so the frames from there on are left in the file
set aside, not guessed at.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from robotrl.core.durable import fsync_dir
from robotrl.runtime.transport.config import ON_CORRUPTION

log = logging.getLogger(__name__)

MAGIC = b"RWL2"
_FRAME = struct.Struct("<4sQII")  # marker, payload length, crc32 of the payload, crc32 of the 16 bytes before it
_HEADER_CHECKED = 16
# frames written before the header checksum; still read, so a log left by an older learner is replayed
LEGACY_MAGIC = b"RWAL"
_LEGACY_FRAME = struct.Struct("<4sQI")


class DamagedLogError(RuntimeError):
    """The log is damaged before its end: acknowledged records would be lost by cutting it there."""


def frame(payload: bytes) -> bytes:
    head = struct.pack("<4sQI", MAGIC, len(payload), zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


@dataclass
class LogScan:
    """What a log's bytes hold: the intact records in order and where it is torn or damaged."""

    records: list[bytes] = field(default_factory=list)
    torn_at: int | None = None  # start of a final frame a crash cut short
    damaged_at: int | None = None  # start of the first damaged frame
    damage: str = ""
    intact_before: int = 0  # records before the first damaged frame
    skipped: int = 0  # frames whose payload failed its checksum (skipped by their checked length)
    lost_from: int | None = None  # offset from which frames cannot be delimited, so are not recovered

    def mark_damaged(self, offset: int, damage: str) -> None:
        if self.damaged_at is None:
            self.damaged_at, self.damage, self.intact_before = offset, damage, len(self.records)


def scan(data: bytes) -> LogScan:
    result, offset, end_of_file = LogScan(), 0, len(data)
    while offset < end_of_file:
        marker = data[offset : offset + 4]
        if marker == MAGIC and end_of_file - offset >= _FRAME.size:
            _, length, crc, header_crc = _FRAME.unpack_from(data, offset)
            if zlib.crc32(data[offset : offset + _HEADER_CHECKED]) != header_crc:
                result.mark_damaged(offset, "frame header checksum mismatch")
                result.lost_from = offset
                break
            end = offset + _FRAME.size + length
            if end > end_of_file:  # the length is checked: the frame really runs past the end
                result.torn_at = offset
                break
            payload = data[offset + _FRAME.size : end]
            if zlib.crc32(payload) == crc:
                result.records.append(payload)
            else:
                result.mark_damaged(offset, "payload checksum mismatch")
                result.skipped += 1
            offset = end
        elif marker == LEGACY_MAGIC and end_of_file - offset >= _LEGACY_FRAME.size:
            _, length, crc = _LEGACY_FRAME.unpack_from(data, offset)
            end = offset + _LEGACY_FRAME.size + length
            if end > end_of_file:  # an unchecked length: a crash's torn tail, or damage this format cannot tell
                result.torn_at = offset
                break
            payload = data[offset + _LEGACY_FRAME.size : end]
            if zlib.crc32(payload) != crc:  # with its length unchecked, nothing after it can be delimited
                result.mark_damaged(offset, "payload checksum mismatch")
                result.lost_from = offset
                break
            result.records.append(payload)
            offset = end
        elif _torn_start(data[offset:]):
            result.torn_at = offset
            break
        else:
            result.mark_damaged(offset, "no frame marker where a frame starts")
            result.lost_from = offset
            break
    return result


def _torn_start(rest: bytes) -> bool:
    """Whether `rest`, the file from where a frame should start, is what a crash mid-append leaves: the start
    of a header, or zeros (a file grown before its data reached the disk)."""
    if len(rest) < _FRAME.size and any(m.startswith(rest[:4]) for m in (MAGIC, LEGACY_MAGIC)):
        return True
    return not any(rest)


class WriteAheadLog:
    def __init__(self, path: Path, on_corruption: str = "refuse"):
        if on_corruption not in ON_CORRUPTION:
            raise ValueError(f"on_corruption must be one of {', '.join(ON_CORRUPTION)}, got {on_corruption!r}")
        self.path = Path(path)
        self.on_corruption = on_corruption
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._file = self.path.open("ab")
        if created:
            fsync_dir(self.path.parent)
        self.records_written = 0  # since the last truncate

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it. A failed write (a full disk, an I/O error) leaves the log as it was
        and raises: a torn record left in place would be taken for damage on the next read."""
        start = self.size_bytes
        try:
            self._file.write(frame(payload))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError:
            self._reopen_at(start)
            raise
        self.records_written += 1

    def _reopen_at(self, size: int) -> None:
        """Cut the file back to `size` bytes and reopen it: the file object's buffer may still hold part of the
        failed record, which its next flush would write."""
        try:
            self._file.close()
        except OSError:
            pass
        os.truncate(self.path, size)
        self._file = self.path.open("ab")

    def read(self) -> list[bytes]:
        """Every intact record in order. A torn final frame is cut off the file (it was never acknowledged);
        damage before the end raises DamagedLogError and changes nothing, or with on_corruption="set_aside"
        keeps the file aside and rewrites the log as its intact records."""
        self._file.flush()
        found = scan(self.path.read_bytes())
        if found.damaged_at is not None:
            if self.on_corruption == "refuse":
                raise DamagedLogError(self._describe(found, "nothing was changed") + _HOW_TO_GO_ON)
            aside = self._set_aside(found.records)
            log.warning("%s", self._describe(found, f"kept as {aside}; the intact records are replayed"))
        elif found.torn_at is not None:
            torn = self.size_bytes - found.torn_at
            log.warning("write-ahead log %s: dropping a torn final record of %d bytes", self.path, torn)
            self._truncate_to(found.torn_at)
        return found.records

    def _describe(self, found: LogScan, outcome: str) -> str:
        after = len(found.records) - found.intact_before
        text = (
            f"write-ahead log {self.path} is damaged at byte {found.damaged_at} ({found.damage}): "
            f"{_count(found.intact_before)} before it and {after} after it"
        )
        if found.skipped > 1:
            text += f"; {found.skipped} frames fail their checksum"
        if found.lost_from is not None:
            text += (
                f"; from byte {found.lost_from} on, where a frame header is damaged, frames cannot be told apart from "
                "payload bytes and are not recovered"
            )
        return f"{text}; {outcome}"

    def _set_aside(self, records: list[bytes]) -> Path:
        """Keep the damaged file as <name>.corrupt-<time> and make the log its intact records. The new log is
        in place before the old one leaves its name, so a crash midway leaves one of them there, never none."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        rebuilt = self.path.with_name(f".{self.path.name}.rebuilt")
        with rebuilt.open("wb") as f:
            f.write(b"".join(frame(r) for r in records))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(self.path, aside)
        except OSError:  # a file system without hard links
            shutil.copy2(self.path, aside)
        self._file.close()
        os.replace(rebuilt, self.path)
        fsync_dir(self.path.parent)
        self._file = self.path.open("ab")
        return aside

    def truncate(self) -> None:
        """Empty the log (after a checkpoint that holds all of it)."""
        self._truncate_to(0)
        self.records_written = 0

    def _truncate_to(self, size: int) -> None:
        self._file.flush()
        os.ftruncate(self._file.fileno(), size)
        os.fsync(self._file.fileno())

    @property
    def size_bytes(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    def close(self) -> None:
        self._file.close()


_HOW_TO_GO_ON = (
    ". Every record in it was acknowledged to an actor, so the learner does not start on it. To start anyway, "
    "set server.wal_on_corruption=set_aside: the file is kept as <name>.corrupt-<time> and its intact records are "
    "replayed"
)


def _count(records: int) -> str:
    return f"{records} intact record{'' if records == 1 else 's'}"
