"""Keep freed memory mapped in the long-running processes (glibc only).

A megabyte argument or result passes through a server or worker as a few fresh buffers
(the request body, a hash, a file write, a pickle). glibc hands each buffer over
128 KiB-32 MiB its own mapping, or trims the heap when it is freed, so the next request's
buffer is page-faulted in again: on virtual machines a first touch costs ~10 us a 4 KiB
page, ~2.5 ms a megabyte. :func:`keep_freed_memory` serves such buffers from the heap and
keeps up to 256 MiB of freed heap mapped, the same as starting the process with
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456``. The price is
resident memory that stays at the process's high-water mark (up to 256 MiB more).

``lakeshore serve``, ``lakeshore dev``, ``lakeshore worker start`` and its job processes
call it; user processes (producers, notebooks) are left alone. Elsewhere than glibc it
does nothing. An environment that sets either variable itself wins.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: buffers up to this size come from the heap (glibc's own upper bound for the setting)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: freed heap kept mapped before glibc returns it to the system
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Tune glibc's allocator for this process (see the module's notes); True when set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
