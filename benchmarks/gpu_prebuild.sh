#!/usr/bin/env bash
# Builds the extension for the GPU machine on this (CPU-only) machine, so that a lent GPU's minutes go to
# running, not compiling (the full build takes ~20 min on 2 cores; with ccache after a first build, seconds):
#
#   PYTHON=/path/to/venv/bin/python benchmarks/gpu_prebuild.sh     (that venv: the GPU machine's Python
#                                                                    version and CUDA torch, e.g. 3.12 and
#                                                                    torch 2.11.0+cu130; never CI's venv)
#
# The CUDA kernels need nvcc (here: CUDA_HOME, default /usr/local/cuda) and cuBLAS's headers, which come
# with that venv's nvidia-cublas wheel: a CUDA_HOME of links joins the two. The tracked tree (with its
# uncommitted changes) is copied to build/gpu-prebuilt/src and built there, so the checkout's own build
# (another Python, the CPU torch) is left alone. Out: build/gpu-prebuilt/torch_semiring/ holds _C*.so,
# _preload*.so and _build_info.py; carry it to the GPU machine and run
#   PREBUILT=build/gpu-prebuilt/torch_semiring benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:?set PYTHON to the python of a venv with the CUDA torch of the GPU machine}
CUDA=${CUDA_HOME:-/usr/local/cuda}
OUTDIR=build/gpu-prebuilt
"$PY" -c "import torch, sys; assert torch.version.cuda, 'a CUDA build of torch is needed'; print('torch', torch.__version__, 'python', sys.version.split()[0])"
SITE=$("$PY" -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
CUBLAS_H=$(find "$SITE/nvidia" -name cublas_v2.h 2>/dev/null | head -1)
[ -n "$CUBLAS_H" ] || { echo "gpu_prebuild.sh: no cublas_v2.h under $SITE/nvidia (the nvidia-cublas wheel)"; exit 1; }
CUBLAS_LIB=$(find "$(dirname "$(dirname "$CUBLAS_H")")" -name 'libcublas.so.*' | head -1)
CUBLASLT_LIB=$(find "$(dirname "$(dirname "$CUBLAS_H")")" -name 'libcublasLt.so.*' | head -1)
SHIM=$PWD/$OUTDIR/cuda-home
rm -rf "$SHIM" && mkdir -p "$SHIM/include" "$SHIM/lib64"
ln -s "$CUDA/bin" "$SHIM/bin"
for f in "$CUDA"/include/*; do ln -s "$f" "$SHIM/include/"; done
for f in "$(dirname "$CUBLAS_H")"/cublas*; do ln -sf "$f" "$SHIM/include/"; done
for f in "$CUDA"/lib64/*; do ln -s "$f" "$SHIM/lib64/"; done
ln -sf "$CUBLAS_LIB" "$SHIM/lib64/libcublas.so"
[ -n "$CUBLASLT_LIB" ] && ln -sf "$CUBLASLT_LIB" "$SHIM/lib64/libcublasLt.so"
mkdir -p "$OUTDIR/src"
# Copy only the files whose content changed, stamped now: a copy that kept the tree's own mtimes could be
# older than an object file of an earlier prebuild made from other content, and ninja would keep that object.
git ls-files -z | while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  if ! cmp -s "$f" "$OUTDIR/src/$f"; then mkdir -p "$(dirname "$OUTDIR/src/$f")" && cp "$f" "$OUTDIR/src/$f"; fi
done
(cd "$OUTDIR/src" && CUDA_HOME="$SHIM" MAX_JOBS=${MAX_JOBS:-2} "$PY" setup.py -q build_ext --inplace)
rm -rf "$OUTDIR/torch_semiring" && mkdir -p "$OUTDIR/torch_semiring"
cp "$OUTDIR"/src/python/torch_semiring/_C*.so "$OUTDIR"/src/python/torch_semiring/_preload*.so \
   "$OUTDIR"/src/python/torch_semiring/_build_info.py "$OUTDIR/torch_semiring/"
grep -q "CUDA_KERNELS = True" "$OUTDIR/torch_semiring/_build_info.py" || { echo "gpu_prebuild.sh: built without the CUDA kernels"; exit 1; }
ls -la "$OUTDIR/torch_semiring"
