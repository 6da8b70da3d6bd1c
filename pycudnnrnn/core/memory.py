"""Memory a call may take, decided before it takes it.

A backend estimates the bytes a call will allocate (outputs, reserve space, scratch) and
calls ``ensure_available`` before allocating. An estimate under ``CHECK_ABOVE`` passes
without a look (a failure there is cheap and unlikely); a larger one is compared with the
host memory available now: ``MemAvailable`` from ``/proc/meminfo``, lowered to what the
process's cgroup (v2 or v1) and its address-space limit (``ulimit -v``) still allow, or
``FALLBACK_BYTES`` where none is known.
"""

from __future__ import annotations

from ..errors import InsufficientMemoryError

#: Estimates up to this many bytes are not checked.
CHECK_ABOVE = 256 << 20
#: What counts as available where the system does not say (1 TiB: only absurd sizes fail).
FALLBACK_BYTES = 1 << 40

_CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                   "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _address_space_left() -> int | None:
    """What ``RLIMIT_AS`` (``ulimit -v``) leaves of the address space, when one is set."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return max(limit - size, 0)


def available_bytes() -> tuple[int, str]:
    """Host memory a call may still allocate, and where that figure comes from."""
    found = []
    meminfo = _mem_available()
    if meminfo is not None:
        found.append((meminfo, "MemAvailable in /proc/meminfo"))
    for limit_path, usage_path in _CGROUP_LIMITS:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None:
            found.append((max(limit - usage, 0), f"the cgroup limit {limit_path}"))
            break
    address_space = _address_space_left()
    if address_space is not None:
        found.append((address_space, "the address-space limit (ulimit -v)"))
    if not found:
        return FALLBACK_BYTES, "no figure from the system: a fallback of 1 TiB"
    return min(found)


def ensure_available(required_bytes: int, what: str) -> None:
    """Raise ``InsufficientMemoryError`` if `required_bytes` exceeds the memory available."""
    if required_bytes <= CHECK_ABOVE:
        return
    available, source = available_bytes()
    if required_bytes > available:
        raise InsufficientMemoryError(what, required_bytes, available, source)
