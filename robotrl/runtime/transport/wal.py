"""An append-only, fsynced log of accepted payloads: what the learner acknowledged since its last checkpoint.

Each record is framed as magic, length and CRC32, then the payload bytes. `append` returns only once the
record is on disk, so an acknowledgement sent after it survives a SIGKILL or power loss. A torn or corrupt
tail (a write cut short by a crash, never acknowledged) ends the log: `open` drops it. The learner empties
the log once a checkpoint holding everything in it is written.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

from robotrl.runtime.durable import fsync_dir

log = logging.getLogger(__name__)

MAGIC = b"RWAL"
_FRAME = struct.Struct("<4sQI")  # magic, payload length, crc32 of the payload


class WriteAheadLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._file = self.path.open("ab")
        if created:
            fsync_dir(self.path.parent)
        self.records_written = 0  # since the last truncate

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it. A failed write (a full disk, an I/O error) leaves the log as it was
        and raises: a torn record left in place would end the log there, dropping every acknowledged record
        appended after it from the next read."""
        start = self.size_bytes
        try:
            self._file.write(_FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
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
        """Every intact record in order; a torn or corrupt tail is cut off the file (it was never acknowledged)."""
        data = self.path.read_bytes()
        records, offset = [], 0
        while offset < len(data):
            end = offset + _FRAME.size
            if end > len(data):
                break
            magic, length, crc = _FRAME.unpack(data[offset:end])
            payload = data[end : end + length]
            if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
                break
            records.append(payload)
            offset = end + length
        if offset < len(data):
            log.warning("write-ahead log %s: dropping a torn tail of %d bytes", self.path, len(data) - offset)
            self._truncate_to(offset)
        return records

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
