"""The files of one checkpoint directory: a manifest of their sha256s, written after them, and reads that check
each file against it before parsing, so a corrupt, truncated or foreign file is reported by path, never loaded."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from robotrl.core.checksum import SHA256_HEX, mismatch_problem, sha256_of_file

log = logging.getLogger("robotrl.runtime.checkpoint")

MANIFEST = "manifest.json"
FORMAT_NAME = "robotrl.checkpoint"
FORMAT_VERSION = 1
_FILE_NAME = re.compile(r"[A-Za-z0-9_]+\.(safetensors|json)")


class CheckpointError(ValueError):
    """A checkpoint file, or the `latest` pointer, is corrupt, truncated or not what the saver writes; names it."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(str(path), problem)
        self.path = Path(path)
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def write_json(path: Path, obj: Any) -> None:
    """Write and fsync; atomic only together with the rename of the directory that holds `path`."""
    with path.open("w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def write_manifest(directory: Path) -> None:
    """Record the sha256 of every file in `directory`. Written last: a file it lists was complete before it."""
    files = {p.name: sha256_of_file(p) for p in sorted(directory.iterdir()) if p.name != MANIFEST}
    write_json(directory / MANIFEST, {"format": FORMAT_NAME, "version": FORMAT_VERSION, "files": files})


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor holding a NaN or an infinity, or None."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return name
    return None


class CheckpointFiles:
    """Reads one checkpoint directory's files, each checked against the manifest's sha256 before it is parsed.

    A checkpoint saved before manifests existed loads unchecked, with a warning: refusing it would strand every
    run trained until then, and its files are still parsed with errors that name them."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._recorded = self._read_manifest()

    def _read_manifest(self) -> dict[str, str] | None:
        path = self.directory / MANIFEST
        if not path.exists():
            log.warning(
                "%s is missing (a checkpoint saved without checksums): its files are loaded without checking "
                "them for corruption",
                path,
            )
            return None
        raw = self._parse_json(path)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise CheckpointError(path, f"not a checkpoint manifest (format {FORMAT_NAME!r})")
        if raw.get("version") != FORMAT_VERSION:
            raise CheckpointError(path, f"version {raw.get('version')!r}, this code reads {FORMAT_VERSION}")
        files = raw.get("files")
        if not isinstance(files, dict):
            raise CheckpointError(path, f"'files' must map file names to sha256s, got {files!r}")
        for name, digest in files.items():
            if not _FILE_NAME.fullmatch(name) or not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
                raise CheckpointError(path, f"bad entry {name!r}: {digest!r} (a file name and 64 hex digits)")
        return files

    def checked(self, name: str) -> Path:
        """The path of file `name` after checking its sha256 against the manifest."""
        path = self.directory / name
        if self._recorded is None:
            return path
        if name not in self._recorded:
            raise CheckpointError(path, f"not listed in {MANIFEST}")
        try:
            digest = sha256_of_file(path)
        except OSError as err:
            raise CheckpointError(path, f"cannot read it: {err.strerror}") from None
        if digest != self._recorded[name]:
            raise CheckpointError(path, mismatch_problem(digest, self._recorded[name], MANIFEST))
        return path

    def json(self, name: str) -> dict[str, Any]:
        path = self.checked(name)
        raw = self._parse_json(path)
        if not isinstance(raw, dict):
            raise CheckpointError(path, f"expected a JSON object, got {type(raw).__name__}")
        return raw

    def tensors(self, name: str, device: str | torch.device = "cpu", finite: bool = False) -> dict[str, torch.Tensor]:
        """The tensors of file `name` on `device`; `finite` refuses a floating tensor holding a NaN or infinity."""
        path = self.checked(name)
        try:
            tensors = load_file(str(path), device=str(device))
        except FileNotFoundError:
            raise CheckpointError(path, "missing") from None
        except (SafetensorError, OSError) as err:
            raise CheckpointError(path, f"not a readable safetensors file: {err}") from None
        if finite and (bad := first_non_finite(tensors)) is not None:
            raise CheckpointError(path, f"tensor {bad!r} is not finite (NaN or infinity)")
        return tensors

    @staticmethod
    def _parse_json(path: Path) -> Any:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(path, "missing") from None
        except OSError as err:
            raise CheckpointError(path, f"cannot read it: {err.strerror}") from None
        except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
            raise CheckpointError(path, f"not valid JSON: {err}") from None
