"""cuBLAS's headers for `make cuda-check`, from the registry's nvidia-cublas wheel.

A compiler-only CUDA install has no cublas_v2.h, so the exp-shift product's
cuBLAS driver (csrc/kernels/cuda/exp_shift.cu, ts_exp_shift_matmul) would not
be compiled. The wheel ships the headers: download it (no dependencies, pip's
cache) and extract only its include/ files into DEST/include. Nothing is
installed; no CUDA torch is involved.

    python tools/fetch_cublas_headers.py build/cublas
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile


def main(dest: str) -> int:
    include = os.path.join(dest, "include")
    if os.path.exists(os.path.join(include, "cublas_v2.h")):
        return 0
    wheels = os.path.join(dest, "wheel")
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "nvidia-cublas", "-d", wheels])
    (wheel,) = glob.glob(os.path.join(wheels, "nvidia_cublas-*.whl"))
    os.makedirs(include, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if "/include/" in name and not name.endswith("/"):
                with z.open(name) as src, open(os.path.join(include, os.path.basename(name)), "wb") as out:
                    out.write(src.read())
    os.remove(wheel)  # the headers are what is kept
    print(f"cuBLAS headers from {os.path.basename(wheel)} in {include}")
    return 0 if os.path.exists(os.path.join(include, "cublas_v2.h")) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
