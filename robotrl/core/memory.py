"""How much memory a device has free, and how much a structure of tensors takes: the checks that refuse a
setting the machine cannot hold at start-up, naming it, instead of failing inside an allocator (or being
killed by the kernel's OOM killer hours into a run)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch

GB = 1 << 30


def available_bytes(device: torch.device) -> tuple[str, int]:
    """(what the figure is, free bytes) where `device` allocates: free CUDA memory, or the CPU's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return "free CUDA memory", int(free)
    return "available RAM", available_ram()


def available_ram() -> int:
    """Linux's MemAvailable (what can be allocated without swapping), else the free physical pages; in a container
    with a memory limit (cgroup v1 or v2), no more than the limit leaves."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return min(available, _cgroup_room())


def _cgroup_room() -> int:
    """Room left under this process's cgroup memory limit (v2 memory.max, or v1 memory.limit_in_bytes);
    unbounded where there is none."""
    unbounded = 1 << 62
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return unbounded
    for _, controllers, path in entries:
        if not controllers:
            limit_file, used_file = f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup{path}/memory.current"
        elif "memory" in controllers.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            limit_file, used_file = f"{base}/memory.limit_in_bytes", f"{base}/memory.usage_in_bytes"
        else:
            continue
        try:
            limit, used = _read(limit_file), _read(used_file)
        except OSError:
            continue
        if limit != "max" and int(limit) < unbounded:
            return max(0, int(limit) - int(used))
    return unbounded


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc/self/statm), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def tensor_bytes(obj) -> int:
    """Bytes of every tensor among `obj`'s attributes (and in dicts among them). Built on the "meta" device,
    an object's tensors have their full shapes and take no memory: its size is known before allocating it."""
    values = obj.values() if isinstance(obj, Mapping) else vars(obj).values()
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, Mapping):
            total += tensor_bytes(value)
    return total


def check_fits(what: str, sizes: Mapping[str, int], device: torch.device, advice: Callable[[int], str]) -> None:
    """MemoryError where the parts in `sizes` (setting as written -> bytes) together exceed what `device` has free;
    `advice(free bytes)` ends its message."""
    need = sum(sizes.values())
    where, free = available_bytes(device)
    if need > free:
        parts = ", ".join(f"{setting}: {size / GB:.1f} GB" for setting, size in sizes.items())
        raise MemoryError(
            f"{what} needs {need / GB:.1f} GB on {device} ({parts}), but the {where} is {free / GB:.1f} GB; "
            + advice(free)
        )
