"""Keep freed memory in the process instead of handing it back to the kernel (glibc).

The DP (:mod:`planner.solvers.dp.search`) builds and drops numpy arrays of 0.1-10 MB thousands of
times
per micro-batch search. glibc serves an allocation above its mmap threshold (128 KiB at
first, raised as larger blocks are freed) with a fresh mapping, and returns the free top
of its heap to the kernel once it exceeds the trim threshold (twice the mmap
threshold), so such arrays keep arriving on pages the kernel must fault in again:
planning pipedream-vgg16 on 64 Jetson Nanos took ~160,000 minor page faults, 0.30-0.40
s of kernel time in 1.0-1.1 s of CPU, and that kernel time was the part that varied most
between identical runs (docs/decisions.md, session 14). :func:`retain_freed_memory`
raises both thresholds once per process: allocations up to ``MMAP_THRESHOLD`` come from
the heap, and up to ``TRIM_THRESHOLD`` of free heap stays mapped for the next one (0.76 s,
a few dozen faults). The cost is that the process keeps its peak heap (the DP's peak
resident memory is unchanged: 0.82-0.84 GiB on 512 devices of 8 types) until it exits.

Elsewhere than on glibc (musl, macOS) the call does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 2**20
#: free heap kept mapped at its top
TRIM_THRESHOLD = 2**30


@functools.cache
def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (module docstring); True when both took."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    took = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and took
