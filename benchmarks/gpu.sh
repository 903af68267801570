#!/usr/bin/env bash
# The kernel and model benchmarks on a GPU machine, in one command:
#
#   PYTHON=/path/to/python-with-CUDA-torch benchmarks/gpu.sh
#
# NEVER RUN: this script was written on a machine without a GPU (and with a
# CPU-only torch), so it has not been executed anywhere; expect to fix
# details on the first run. What it does:
#   1. make cuda-check (compile-only, sm_80/sm_90);
#   2. builds csrc/kernels/cuda/*.cu for this GPU (-arch=native) into a
#      shared library (cuBLAS linked when cublas_v2.h is found);
#   3. tests/test_cuda_emulation.py — its "cuda" cases run the kernels on the
#      GPU against the references (they are skipped on machines without one);
#   4. times the CUDA kernels through their C API (api.h) against torch.mm
#      (cuBLAS SGEMM) on the same GPU, CUDA events, median of 20;
#   5. benchmarks/kernels.py (CPU kernels), then benchmarks/run.py for the
#      Llama-style decoder in bf16 on the GPU (--device cuda --dtype bfloat16):
#      every semiring, ratio to the stock backward, peak from torch's allocator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: needs a CUDA GPU and a CUDA build of torch in \$PYTHON')"

make cuda-check NVCC="$NVCC"
mkdir -p build/cuda-bench
LIBS=""
if echo '#include <cublas_v2.h>' | "$NVCC" -x cu -E - -o /dev/null 2>/dev/null; then LIBS="-lcublas"; fi
"$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -arch=native -shared -Xcompiler -fPIC -Icsrc \
  -o build/cuda-bench/libts_cuda.so csrc/kernels/cuda/*.cu $LIBS

PYTHONPATH=python "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_emulation.py

"$PY" - build/cuda-bench/libts_cuda.so <<'PYEOF'
import ctypes, sys, torch
sys.path.insert(0, "tests")
from test_cuda_emulation import _load  # the same ctypes signatures as the tests
lib = _load(sys.argv[1])
stream = lambda: torch.cuda.current_stream().cuda_stream

def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]

print(f"GPU: {torch.cuda.get_device_name()}")
print(f"{'n':>5} {'product':<24} {'ms':>9} {'G terms/s':>10} {'x torch.mm':>10}")
for n in (1024, 2048, 4096):
    a = torch.randn(n, n, device="cuda"); w = torch.randn(n, n, device="cuda")
    mm = timed(lambda: torch.mm(a, w))
    print(f"{n:>5} {'torch.mm (cuBLAS)':<24} {mm:9.3f} {n**3 / mm / 1e6:10.1f} {1.0:10.2f}")
    b = torch.empty(n, n, device="cuda")
    assert lib.ts_lift_weights(0, 0, 1, n, n, w.data_ptr(), 0, n, 1, b.data_ptr(), stream()) == 0
    for name, op, dt, arg in [("max_plus", 0, torch.float32, False), ("max_plus + argmax", 0, torch.float32, True),
                              ("max_times bf16 A", 1, torch.bfloat16, False), ("max_prod pair", 2, torch.float32, False)]:
        C = 2 if op == 2 else 1
        x = torch.randn(C, 1, n, n, device="cuda").to(dt)
        c = torch.empty(C, 1, n, n, device="cuda")
        idx = torch.empty(1, n, n, dtype=torch.int32, device="cuda") if arg else None
        call = lambda: lib.ts_max_gemm(op, 0 if dt == torch.float32 else 1, 1, n, n, n, x.data_ptr(), n * n, n * n, n, 1,
                                       b.data_ptr(), 0, n, 1, c.data_ptr(), n * n, n * n, n,
                                       idx.data_ptr() if arg else None, n * n, n, stream())
        t = timed(call)
        print(f"{n:>5} {name:<24} {t:9.3f} {n**3 / t / 1e6:10.1f} {t / mm:10.2f}")
    if hasattr(lib, "ts_exp_shift_matmul"):
        for ent in (0, 1):
            h = torch.rand(1, n, n, device="cuda"); l = torch.empty(1, n, n, device="cuda"); ho = torch.empty_like(l)
            nb = lib.ts_exp_shift_workspace_bytes(ent, 1, n, n, n)
            ws = torch.empty(nb, dtype=torch.uint8, device="cuda"); cnt = ctypes.c_int64()
            call = lambda: lib.ts_exp_shift_matmul(ent, 1, n, n, n, a.data_ptr(), n * n, n, 1, h.data_ptr(), n * n, n, 1,
                                                   0, w.data_ptr(), n * n, n, 1, l.data_ptr(), ho.data_ptr(),
                                                   ws.data_ptr(), nb, ctypes.byref(cnt), None, stream())
            t = timed(call)
            print(f"{n:>5} {('entropy' if ent else 'log') + ' (exp-shift)':<24} {t:9.3f} {n**3 / t / 1e6:10.1f} {t / mm:10.2f}")
    x = torch.randn(n, n, device="cuda"); out = torch.empty(n, device="cuda")
    ix = torch.empty(n, dtype=torch.int64, device="cuda")
    t = timed(lambda: lib.ts_reduce(1, 1, n, n, 1, x.data_ptr(), 0, n, 1, 0, out.data_ptr(), ix.data_ptr(), stream()))
    tt = timed(lambda: torch.max(x, 1))
    print(f"{n:>5} {'argmax over rows':<24} {t:9.3f} {'':>10} {t / tt:10.2f} (x torch.max)")
PYEOF

PYTHONPATH=python "$PY" benchmarks/kernels.py
# The model table: a Llama-style decoder in bf16 on the GPU, every semiring, ratios to stock.
PYTHONPATH=python "$PY" benchmarks/run.py --models decoder --device cuda --dtype bfloat16 \
  --json benchmarks/results/models_cuda_bf16.json
