"""Build and smoke-test torch-semiring against the newest torch on the package registry.

`make newest-torch-check` (CI runs it with TORCH=2.14.1, the newest torch pip
installs on the project's machines; see the cost below). In a venv of its own
under build/newest-torch/ it

1. installs torch (default: the newest release pip installs here, which the
   machine's pip configuration may cap below the newest the registry lists — both
   are reported; --torch V for another) with its plain Python dependencies only,
   and the CUDA libraries only when `import torch` cannot do without them (the
   registry's Linux wheels after 2.13.0+cpu are CUDA builds, and they can't);
2. installs a copy of this tree with `pip install` (the in-tree backend builds
   against that torch; CUDA_HOME points nowhere, so the extension is the CPU
   build a CPU torch would give), timing it;
3. runs the smoke subset: every semiring on a tiny BERT and a tiny Llama (eager
   and sdpa) against the explicit-graph reference, and every node of their
   training graphs has a rule (tests/test_transformers.py);
4. regenerates the rule coverage table for that torch into
   build/newest-torch/coverage-<version>.md (docs/coverage.md is 2.13.0's).

Cost, on the 2-core development machines: the download (a ~540 MB torch wheel,
plus ~3-4 GB of CUDA libraries when torch cannot be imported without them), a
full compile of the extension (no ccache hits: other headers), the smoke tests.
Each step's time is printed and kept in build/newest-torch/report.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["tests/test_transformers.py", "-k",
         "(bert or llama) and (models_match_reference or every_node_has_a_rule)"]
# What the smoke tests import beside torch and the package.
TEST_DEPS = ["pytest", "hypothesis", "transformers", "numpy"]
# Left out of the copy that is built: build outputs, environments, results.
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "*.so", "_build_info.py", "__pycache__",
                                     "*.egg-info", "demo_out", "explain_out", ".hypothesis", ".pytest_cache")
CUDA_PREFIXES = ("nvidia-", "triton", "cuda-")


def log(message: str) -> None:
    print(f"[newest-torch-check] {message}", flush=True)


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kwargs)


def newest_listed(python: str) -> str:
    """The newest torch release the registry lists (pip's constraints do not apply to the listing)."""
    out = subprocess.run([python, "-m", "pip", "index", "versions", "torch"], check=True,
                         capture_output=True, text=True).stdout
    listed = re.search(r"Available versions: (.*)", out)
    return listed.group(1).split(",")[0].strip() if listed else "unknown"


def timed(report: dict, step: str, fn):
    start = time.perf_counter()
    result = fn()
    report["seconds"][step] = round(time.perf_counter() - start, 1)
    log(f"{step}: {report['seconds'][step]} s")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", help="torch version (default: the newest pip installs here)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "newest-torch"))
    args = ap.parse_args(argv)

    work = os.path.abspath(args.work)
    venv, src = os.path.join(work, "venv"), os.path.join(work, "src")
    vpy = os.path.join(venv, "bin", "python")
    os.makedirs(work, exist_ok=True)
    report = {"torch_requested": args.torch or "newest", "newest_listed": newest_listed(sys.executable),
              "seconds": {}}
    pip_env = dict(os.environ)
    pip = [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    spec = f"torch=={args.torch}" if args.torch else "torch"

    if not os.path.exists(vpy):
        run([sys.executable, "-m", "venv", venv])

    def install_torch():
        run(pip + ["--no-deps", "--only-binary", ":all:", spec], env=pip_env)
        requires = subprocess.run([vpy, "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('torch')))"],
                                  check=True, capture_output=True, text=True).stdout.split("\n")
        plain = [r for r in requires if r and not r.lower().startswith(CUDA_PREFIXES)]
        run(pip + plain + TEST_DEPS, env=pip_env)
        if subprocess.run([vpy, "-c", "import torch"], capture_output=True).returncode != 0:
            log("torch cannot be imported without its CUDA libraries: installing them too")
            run(pip + ["--only-binary", ":all:", spec], env=pip_env)
            report["cuda_libraries_installed"] = True
        else:
            report["cuda_libraries_installed"] = False
        found = subprocess.run([vpy, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                               check=True, capture_output=True, text=True).stdout.split()
        report["torch"], report["torch_cuda"] = found[0], found[1]

    timed(report, "install torch", install_torch)
    version = report["torch"]

    if os.path.exists(src):
        shutil.rmtree(src)
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    build_env = {**pip_env, "CUDA_HOME": os.path.join(work, "no-cuda"), "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    timed(report, "pip install (build)", lambda: run(pip + ["--force-reinstall", "--no-deps", src], env=build_env))

    # From outside the tree, so the installed package is the one imported.
    where = subprocess.run([vpy, "-c", "import torch, torch_semiring as ts; print(ts.__file__, torch.__version__)"],
                           check=True, capture_output=True, text=True, cwd=work).stdout.strip()
    log(f"imported: {where}")
    report["imported"] = where

    smoke = timed(report, "smoke tests", lambda: subprocess.run(
        [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE], cwd=src, capture_output=True, text=True))
    print(smoke.stdout[-4000:], smoke.stderr[-2000:], sep="\n")
    report["smoke"] = (smoke.stdout.strip().splitlines() or ["(no output)"])[-1]
    report["smoke_passed"] = smoke.returncode == 0

    coverage = os.path.join(work, f"coverage-{version}.md")
    timed(report, "coverage table", lambda: run(
        [vpy, os.path.join(src, "tools", "gen_semiring_rules.py"), os.path.join(work, "generated"),
         "--coverage", coverage], cwd=work))
    report["coverage"] = coverage
    with open(os.path.join(work, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    log(json.dumps(report, indent=1))
    return 0 if report["smoke_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
