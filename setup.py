"""Builds torch_semiring._C against the installed torch.

The source list lives in csrc/sources.txt (CMakeLists.txt reads the same
file). The rule tables derived from the installed torch's derivatives.yaml are
generated into build/generated before compiling. `pip install .` reaches this
file through tools/build_backend.py, which makes the environment's own torch
visible here; the wheel then requires exactly that torch release.

Release build by default (-O2, no debug info, stripped: 5.6 MB instead of 88 MB);
TORCH_SEMIRING_DEBUG=1 keeps the debug info.
"""
import glob
import os
import subprocess
import sys

from setuptools import Extension, setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join(ROOT, "build", "generated")
# pip asks for the metadata first (egg_info / dist_info) and builds afterwards: the
# metadata needs no generated code, so that run skips the generators (~25 s of CPU).
COMMANDS = set(sys.argv[1:])
METADATA_ONLY = bool(COMMANDS & {"egg_info", "dist_info"}) and not COMMANDS & {
    "build", "build_ext", "bdist_wheel", "install", "develop", "editable_wheel"}


def generate(tool: str, *args: str) -> None:
    """Run tools/<tool> with this interpreter (it reads the installed torch)."""
    if not METADATA_ONLY:
        subprocess.check_call([sys.executable, os.path.join(ROOT, "tools", tool), *args])


generate("gen_rule_tables.py", GENERATED)
# Semiring rules rewritten from derivatives.yaml formulas: one generated translation unit.
generate("gen_semiring_rules.py", GENERATED)
# The LD_PRELOAD interposer (Linux): its symbol list comes from the installed libtorch_cpu.so.
WITH_PRELOAD = sys.platform.startswith("linux")
if WITH_PRELOAD:
    generate("gen_preload_symbols.py", GENERATED)

# The interface of the upstream patch series (torch/csrc/autograd/semiring.h, created by patch 0001), which
# csrc/hooks/series_hooks.cpp implements, extracted from the patch; a torch built with the series has its
# own copy, found first (-idirafter comes after torch's include dirs).
SERIES_INCLUDE = os.path.join(ROOT, "build", "series", "include")
generate("series_files.py", "new", glob.glob(os.path.join(ROOT, "patches", "pytorch", "0001-*.patch"))[0],
         "torch/csrc/autograd/semiring.h", os.path.join(SERIES_INCLUDE, "torch", "csrc", "autograd", "semiring.h"))

with open(os.path.join(ROOT, "csrc", "sources.txt")) as f:
    sources = [line.strip() for line in f if line.strip() and not line.startswith("#")]
sources.append(os.path.relpath(os.path.join(GENERATED, "generated_rules.cpp"), ROOT))

# The CUDA kernels (csrc/kernels/cuda) join the extension only when the
# installed torch is a CUDA build and nvcc is found, whether or not a GPU is
# present; with a CPU torch the extension is built exactly as without them.
# They are compiled and linked (C API in csrc/kernels/cuda/api.h) and called
# for CUDA tensors by csrc/kernels/device_gemm.cpp. The kernels ran on an H100 through their C API
# (benchmarks/gpu.sh), and so did this dispatch, from ts.grad on CUDA graphs. cuBLAS is linked when its header is found
# (the exp-shift driver needs it).
CUDA_DIR = os.path.join(ROOT, "csrc", "kernels", "cuda")
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
WITH_CUDA = bool(torch.version.cuda) and NVCC is not None and os.path.exists(NVCC)
include_dirs = [GENERATED, os.path.join(ROOT, "csrc")]
# No -std flag: torch's BuildExtension adds the standard its own headers need
# (torch 2.13 adds -std=c++20; newer releases' headers refuse C++17). Python's CFLAGS carry -g; -g0
# after them drops the debug info (the bulk of the .so) and speeds up compiling.
DEBUG = os.environ.get("TORCH_SEMIRING_DEBUG", "") not in ("", "0")
opt_flags = ["-O2", "-g"] if DEBUG else ["-O2", "-g0"]
link_flags = [] if DEBUG else ["-s"]
cxx_flags = opt_flags + ["-Wno-unused-parameter", "-idirafter", SERIES_INCLUDE]
if WITH_CUDA:
    cxx_flags.append("-DTS_WITH_CUDA_KERNELS")  # kernels/device_gemm.cpp calls them for CUDA tensors
    cu = sorted(os.path.relpath(os.path.join(CUDA_DIR, f), ROOT) for f in os.listdir(CUDA_DIR) if f.endswith(".cu"))
    have_cublas = os.path.exists(os.path.join(CUDA_HOME, "include", "cublas_v2.h"))
    if have_cublas:  # exp_shift.cu then defines ts_exp_shift_matmul, which device_gemm.cpp calls
        cxx_flags.append("-DTS_CUDA_HAVE_CUBLAS")
    extension = CUDAExtension(
        "torch_semiring._C",
        sources + cu,
        include_dirs=include_dirs,
        libraries=["cublas"] if have_cublas else [],
        extra_link_args=link_flags,
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": ["-O3", "--expt-relaxed-constexpr",
                     "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"],
        },
    )
else:
    extension = CppExtension("torch_semiring._C", sources, include_dirs=include_dirs, extra_compile_args=cxx_flags,
                             extra_link_args=link_flags)

# csrc/preload/interpose.cpp → torch_semiring/_preload*.so, the library to
# LD_PRELOAD (torch_semiring.preload.library_path()). Deliberately not a torch
# extension: it includes no torch header and links only libc/libdl, so
# preloading it into a process costs nothing until torch is imported.
extensions = [extension]
if WITH_PRELOAD:
    extensions.append(Extension(
        "torch_semiring._preload",
        ["csrc/preload/interpose.cpp"],
        include_dirs=[GENERATED],
        extra_compile_args=opt_flags + ["-std=c++17"],
        extra_link_args=link_flags,
        libraries=["dl"],
    ))

# The torch this build is for: the wheel requires that release (the C++ API and
# the generated rule tables are per release) and `import torch_semiring` checks it.
TORCH_RELEASE = torch.__version__.split("+")[0]
with open(os.path.join(ROOT, "python", "torch_semiring", "_build_info.py"), "w") as f:
    f.write(f"# Written by setup.py: the torch this build's extension was compiled against, and\n"
            f"# whether it kept debug info (TORCH_SEMIRING_DEBUG) and holds the CUDA kernels.\n"
            f"TORCH_VERSION = {str(torch.__version__)!r}\nDEBUG = {DEBUG}\nCUDA_KERNELS = {WITH_CUDA}\n")

setup(
    package_dir={"": "python"},
    packages=["torch_semiring"],
    package_data={"torch_semiring": ["py.typed"]},
    install_requires=[f"torch=={TORCH_RELEASE}", "numpy"],
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
