"""Pin OpenBLAS to one thread for the evaluation run.

On a shared 2-core machine a multi-threaded OpenBLAS call (e.g. RAPPOR's 4096 × 360 least-squares decode) can be
many times slower than single-threaded when the cores are busy. The environment variable OPENBLAS_NUM_THREADS only
works before numpy is imported, which ``haarvest`` has already done, so this calls OpenBLAS's own
``*_set_num_threads`` on every OpenBLAS library loaded in the process (numpy's and scipy's wheels bundle their own).
Best effort: returns how many libraries were pinned (0 if none was found, which is harmless).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

__all__ = ["limit_blas_threads"]

_SYMBOLS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def limit_blas_threads(threads: int = 1) -> int:
    import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS, if it has one)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux
        return 0
    pinned = 0
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so[.\d]*)", maps))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SYMBOLS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                pinned += 1
                break
    return pinned
