"""Builds torch_semiring._C against the installed torch.

The source list lives in csrc/sources.txt (CMakeLists.txt reads the same
file). The rule tables derived from the installed torch's derivatives.yaml are
generated into build/generated before compiling.
"""
import os
import subprocess
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join(ROOT, "build", "generated")

subprocess.check_call([sys.executable, os.path.join(ROOT, "tools", "gen_rule_tables.py"), GENERATED])
# Semiring rules rewritten from derivatives.yaml formulas: one generated translation unit.
subprocess.check_call([sys.executable, os.path.join(ROOT, "tools", "gen_semiring_rules.py"), GENERATED])

with open(os.path.join(ROOT, "csrc", "sources.txt")) as f:
    sources = [line.strip() for line in f if line.strip() and not line.startswith("#")]
sources.append(os.path.relpath(os.path.join(GENERATED, "generated_rules.cpp"), ROOT))

setup(
    package_dir={"": "python"},
    packages=["torch_semiring"],
    ext_modules=[
        CppExtension(
            "torch_semiring._C",
            sources,
            include_dirs=[GENERATED, os.path.join(ROOT, "csrc")],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
