"""Payloads on the wire: safetensors bytes of named tensors plus a small JSON header, never a pickle.

A payload is one safetensors blob; its metadata holds one entry, `header`, a JSON object (protocol version,
actor id, sequence number, ...). `decode` checks everything a peer could get wrong or forge before any
tensor is trusted: the total size, the safetensors framing, an allowlist of dtypes, and that every floating
tensor is finite. `check_transitions` and `check_weights` then check a decoded payload against what the
receiver expects (the learner's observation spec, the actor's own parameter shapes). Every failure is a
`WireError` whose message names the offending entry; the service turns it into INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as _load_tensors
from safetensors.torch import save as _save_tensors

from robotrl.core.spec import ObsSpec, TensorSpec

Tensors = dict[str, torch.Tensor]

HEADER_KEY = "header"
MAX_TENSORS = 4096
MAX_HEADER_BYTES = 1 << 20
ACTION_TOLERANCE = 1e-6
# A reward or float observation beyond this magnitude is refused. It is finite, but squared in a TD loss it
# overflows float32 (1e20 ** 2) and stops the learner, and it would again after every restart: an
# acknowledged batch is replayed from the write-ahead log.
MAX_ABS_VALUE = 1e6

# safetensors dtype names a payload may use, and the torch dtype each decodes to
ALLOWED_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "I32": torch.int32,
    "I64": torch.int64,
}
# names used in JSON specs (observation specs sent at registration)
DTYPE_NAMES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "int32": torch.int32,
    "int64": torch.int64,
}
_NAME_OF_DTYPE = {v: k for k, v in DTYPE_NAMES.items()}

TRANSITION_FLAGS = ("terminated", "truncated", "intervened")


class WireError(ValueError):
    """A payload that is malformed or does not fit what the receiver expects."""


def encode(tensors: Mapping[str, torch.Tensor], header: Mapping[str, Any]) -> bytes:
    """Safetensors bytes of `tensors` (moved to the CPU) with `header` as JSON metadata."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"payload entry {name!r} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in _NAME_OF_DTYPE:
            raise WireError(f"payload entry {name!r} has dtype {value.dtype}, not one the wire carries")
    plain = {name: value.detach().cpu().contiguous() for name, value in tensors.items()}
    return _save_tensors(plain, metadata={HEADER_KEY: json.dumps(dict(header), separators=(",", ":"))})


def decode(data: bytes, max_bytes: int) -> tuple[dict[str, Any], Tensors]:
    """(header, tensors) of a payload, or WireError naming what is wrong with it."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"payload must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise WireError(f"payload of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    entries, metadata = _read_safetensors_header(data)
    try:
        tensors = _load_tensors(data)
    except Exception as err:  # safetensors raises its own error type for every framing problem
        raise WireError(f"malformed safetensors payload: {err}") from None
    if set(tensors) != set(entries):
        raise WireError("malformed safetensors payload: tensor names disagree with its header")
    for name, value in tensors.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise WireError(f"payload entry {name!r} holds non-finite values (NaN or inf)")
    return _parse_json_header(metadata), tensors


def _read_safetensors_header(data: bytes) -> tuple[dict[str, dict], dict]:
    """The tensor entries and metadata of a safetensors blob, checked before any tensor is built."""
    if len(data) < 8:
        raise WireError(f"payload of {len(data)} bytes is too short to be safetensors")
    (length,) = struct.unpack("<Q", data[:8])
    if length > min(len(data) - 8, MAX_HEADER_BYTES):
        raise WireError(
            f"payload is not safetensors: it declares a {length}-byte header, then has {len(data) - 8} bytes"
        )
    try:
        header = json.loads(data[8 : 8 + length])
    except (ValueError, RecursionError) as err:  # not JSON, an integer of thousands of digits, deep nesting
        raise WireError(f"payload is not safetensors: its header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise WireError(f"payload is not safetensors: its header is a JSON {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if len(header) > MAX_TENSORS:
        raise WireError(f"payload holds {len(header)} tensors, more than the limit of {MAX_TENSORS}")
    for name, entry in header.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if dtype not in ALLOWED_DTYPES:
            allowed = ", ".join(ALLOWED_DTYPES)
            raise WireError(f"payload entry {name!r} has dtype {dtype!r}; allowed: {allowed}")
    if not isinstance(metadata, dict):
        raise WireError("payload metadata is not a JSON object")
    return header, metadata


def _parse_json_header(metadata: dict) -> dict[str, Any]:
    text = metadata.get(HEADER_KEY)
    if not isinstance(text, str):
        raise WireError(f"payload lacks its JSON {HEADER_KEY!r} metadata entry")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise WireError(f"payload {HEADER_KEY!r} metadata is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise WireError(f"payload {HEADER_KEY!r} metadata must be a JSON object, got {type(header).__name__}")
    return header


# ---- what the receiver expects ----------------------------------------------------------------------------


def transition_keys(obs_spec: ObsSpec) -> set[str]:
    """The entries of a transition batch: obs.<key>, next_obs.<key>, action, reward and the step flags."""
    keys = {f"{part}.{key}" for key in obs_spec for part in ("obs", "next_obs")}
    return keys | {"action", "reward", *TRANSITION_FLAGS}


def check_transitions(
    tensors: Mapping[str, torch.Tensor], obs_spec: ObsSpec, action_dim: int, num_envs: int, max_steps: int
) -> int:
    """Check a batch of N steps of `num_envs` envs ([N, E, ...] entries) against the learner's spec; returns N."""
    expected = transition_keys(obs_spec)
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        raise WireError(f"transition batch lacks {missing}")
    if unexpected:
        raise WireError(f"transition batch has unexpected entries {unexpected}")
    reward = tensors["reward"]
    if reward.dim() != 2 or reward.shape[1] != num_envs:
        raise WireError(f"'reward' must have shape [steps, {num_envs}], got {list(reward.shape)}")
    steps = reward.shape[0]
    if not 1 <= steps <= max_steps:
        raise WireError(f"transition batch has {steps} steps; between 1 and {max_steps} are accepted")
    lead = (steps, num_envs)
    _check_entry(tensors, "reward", lead, torch.float32)
    _check_entry(tensors, "action", (*lead, action_dim), torch.float32)
    for flag in TRANSITION_FLAGS:
        _check_entry(tensors, flag, lead, torch.bool)
    for key, spec in obs_spec.items():
        for part in ("obs", "next_obs"):
            _check_entry(tensors, f"{part}.{key}", (*lead, *spec.shape), spec.dtype)
    if (tensors["action"].abs() > 1.0 + ACTION_TOLERANCE).any():
        raise WireError("'action' has values outside [-1, 1]")
    for name, value in tensors.items():
        if value.is_floating_point() and (value.abs() > MAX_ABS_VALUE).any():
            raise WireError(f"{name!r} has values beyond +-{MAX_ABS_VALUE:g} (largest {value.abs().max().item():.3g})")
    return steps


def _check_entry(tensors: Mapping[str, torch.Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    value = tensors[name]
    if tuple(value.shape) != shape:
        raise WireError(f"{name!r} must have shape {list(shape)}, got {list(value.shape)}")
    if value.dtype != dtype:
        raise WireError(f"{name!r} must have dtype {dtype}, got {value.dtype}")


def check_weights(tensors: Mapping[str, torch.Tensor], template: Mapping[str, torch.Tensor]) -> None:
    """Check received weights against the receiver's own tensors of the same names (shape and dtype)."""
    missing, unexpected = sorted(set(template) - set(tensors)), sorted(set(tensors) - set(template))
    if missing or unexpected:
        raise WireError(f"weights do not fit this agent: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, own in template.items():
        _check_entry(tensors, name, tuple(own.shape), own.dtype)


# ---- observation specs as JSON ----------------------------------------------------------------------------


def spec_to_json(obs_spec: ObsSpec) -> dict[str, dict[str, Any]]:
    return {key: {"shape": list(s.shape), "dtype": _NAME_OF_DTYPE[s.dtype]} for key, s in obs_spec.items()}


def spec_from_json(value: Any) -> dict[str, TensorSpec]:
    """An observation spec from its JSON form, or WireError naming the bad entry."""
    if not isinstance(value, dict) or not value:
        raise WireError(f"observation spec must be a non-empty JSON object, got {value!r}")
    spec = {}
    for key, entry in value.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise WireError(f"observation spec entry {key!r} has a bad shape {shape!r}")
        if dtype not in DTYPE_NAMES:
            raise WireError(f"observation spec entry {key!r} has dtype {dtype!r}; allowed: {', '.join(DTYPE_NAMES)}")
        spec[key] = TensorSpec(tuple(shape), DTYPE_NAMES[dtype])
    return spec
