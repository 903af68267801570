#!/usr/bin/env bash
# Everything that needs a GPU, in one command (the project's GPU machine: CUDA torch, nvcc):
#
#   benchmarks/gpu.sh                 (PYTHON=python-with-CUDA-torch, default python3; LOG_DIR, default $OUT
#                                      on the device machine, else build/gpu)
#
# PREBUILT=DIR: copy the extension built by benchmarks/gpu_prebuild.sh on the development machine instead of
# building it here (step 1 is then skipped; carry DIR to the GPU machine).
# Steps (each logged to LOG_DIR/<step>.log, timed; a failing step does not stop the later ones,
# the script's exit status is the number of failed steps; STEPS="build device_tests" runs a subset):
#   1. builds the extension in place with the CUDA kernels (setup.py: CUDA torch + nvcc → TS_WITH_CUDA_KERNELS,
#      sm_80/sm_90), MAX_JOBS = the machine's cores (torch 2.11 on: csrc/engine/node_compat.h);
#   2. tests/test_cuda_emulation.py: the kernels' C API on the GPU (and the host emulation) against the references;
#   3. tests/test_cuda_device.py + test_device_dispatch.py: every semiring on CUDA graphs (the model zoo, small
#      graphs in float64/float32, top paths, a bf16 decoder) against the same graphs on the CPU;
#   4. the CUDA kernels through their C API against torch.mm (cuBLAS SGEMM) on the same GPU, CUDA events,
#      median of 20;
#   5. benchmarks/run.py for the Llama-style decoder in bf16 on the GPU (--device cuda --dtype bfloat16):
#      every semiring, ratio to the stock backward, peak from torch's allocator.
# TEST_TIMEOUT / BENCH_TIMEOUT (seconds) bound steps 3 and 5 on a lent machine.
# Wheels under .whl/ (e.g. the transformers the tests were written against) are installed into
# /tmp/site first and put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG_DIR=${LOG_DIR:-${OUT:-build/gpu}}
mkdir -p "$LOG_DIR" build/cuda-bench
FAILED=0
step() {  # step NAME COMMAND...: run, log, time
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOG_DIR/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"; tail -n ${TAIL:-15} "$LOG_DIR/$name.log"
  [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
}
if ls .whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
  torch.cuda.get_device_name(), '| transformers', transformers.__version__)" || exit 99

# STEPS (default: all five) picks steps by name: build kernel_tests device_tests kernel_timings decoder_bf16.
STEPS=${STEPS:-build kernel_tests device_tests kernel_timings decoder_bf16}
want() { [[ " $STEPS " == *" $1 "* ]]; }
# The extension builds against the torch there (csrc/engine/node_compat.h: 2.11 and 2.12 hold autograd nodes
# by shared_ptr, 2.13 on by intrusive_ptr); steps 3 and 5 need it.
WITH_EXTENSION=0
if [ -n "${PREBUILT:-}" ]; then  # made on the development machine by benchmarks/gpu_prebuild.sh
  cp "$PREBUILT"/_C*.so "$PREBUILT"/_preload*.so "$PREBUILT"/_build_info.py python/torch_semiring/
  "$PY" -c "from torch_semiring import _build_info as b; print('prebuilt for', b.TORCH_VERSION, 'CUDA kernels:', b.CUDA_KERNELS)" \
    && WITH_EXTENSION=1
elif want build; then
  step build env MAX_JOBS=$(nproc) "$PY" setup.py -q build_ext --inplace
  "$PY" -c "from torch_semiring import _build_info as b; print('built for', b.TORCH_VERSION, 'CUDA kernels:', b.CUDA_KERNELS)" \
    && WITH_EXTENSION=1
elif "$PY" -c "import torch_semiring" 2>/dev/null; then
  WITH_EXTENSION=1
fi
want kernel_tests && step kernel_tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_cuda_emulation.py
if [ $WITH_EXTENSION = 1 ]; then
  want device_tests && step device_tests timeout ${TEST_TIMEOUT:-1800} "$PY" -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda_device.py \
    tests/test_device_dispatch.py
else
  echo "gpu.sh: no extension: steps 3 and 5 not run"; FAILED=$((FAILED + 1))
fi

LIBS=""
if echo '#include <cublas_v2.h>' | nvcc -x cu -E - -o /dev/null 2>/dev/null; then LIBS="-lcublas"; fi
want kernel_timings && step kernel_lib nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=native -shared -Xcompiler -fPIC -Icsrc \
  -o build/cuda-bench/libts_cuda.so csrc/kernels/cuda/*.cu $LIBS
kernel_timings() {
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
}
want kernel_timings && TAIL=40 step kernel_timings kernel_timings
# The model table: a Llama-style decoder in bf16 on the GPU, every semiring, ratios to stock.
[ $WITH_EXTENSION = 1 ] && want decoder_bf16 && TAIL=30 step decoder_bf16 timeout ${BENCH_TIMEOUT:-1800} env BENCH_ROUNDS=${BENCH_ROUNDS:-3} "$PY" benchmarks/run.py --models decoder \
  --device cuda --dtype bfloat16 --json "$LOG_DIR/models_cuda_bf16.json"
echo "gpu.sh: $FAILED step(s) failed"
exit $FAILED
