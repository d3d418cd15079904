"""SHA-256 checksums of stored files, recorded when a file is written and compared when it is read back, so a
corrupt or truncated file is reported by path instead of being loaded."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK_BYTES = 1 << 20


def sha256_of_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_of_file(path: Path) -> str:
    """Read in chunks: a replay buffer's file can be larger than the memory there is to spare for a copy."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch_problem(digest: str, expected: str, recorded_by: str) -> str:
    """What to report for a file whose sha256 `digest` is not the `expected` one `recorded_by` holds."""
    return f"checksum mismatch (sha256 {digest}, {recorded_by} says {expected}): the file is corrupt or truncated"
