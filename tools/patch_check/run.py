"""`make patch-check`: the upstream patch series (patches/pytorch/) applied,
compiled and run as real code inside the installed torch wheel.

    python tools/patch_check/run.py [--preimage DIR] [--build DIR]

Stages, one line of output each; the last line says what ran:

1. apply    Copy the pre-image (../shared/pytorch-preimage: the upstream files
            the series applies to, a fixture kept outside the project) into
            BUILD/tree, taking the wheel's own copy of every file the wheel
            ships (torch/autograd/*.py); `git am` the series onto it and check
            that every `index` line names the blobs the patch goes from and to.
2. layout   The series changes no existing header, and struct_sizes.cpp prints
            the same sizes of the engine's structs with the patched tree's
            include path as with the wheel's headers alone (and asserts the
            wheel's sizes).
3. compile  Every patched and new translation unit against the wheel's
            headers: input_buffer.cpp, input_metadata.cpp, accumulate_grad.cpp,
            engine.cpp and the new semiring.cpp (-Werror) into
            libts_series_engine.so with shim.cpp (4 definitions the wheel does
            not export), to be LD_PRELOADed; init.cpp syntax-only (its added
            lines also run, see 4).
4. bindings _ts_series_bindings: the lines patch 0001 adds to
            THPAutograd_initExtension (init.cpp), extracted from the patch and
            run on torch._C._autograd (-Werror); that function is not exported
            by the wheel, so it cannot be replaced by preloading.
5. overlay  BUILD/overlay/torch: the wheel's torch package (symlinks) with the
            patched torch/autograd files; its sitecustomize.py loads the
            bindings before torch.autograd.semiring_mode is first imported.
6. run      With the engine preloaded and the overlay first on the path:
            patch 0004's tests (torch_semiring importable, so none skipped:
            its semirings registered through the series' API); the project's
            tests/preload/stock_engine_cases.py (every semiring, PyTorch's
            engine against torch-semiring's own); and, with no semiring set,
            tests/patch_check/stock_behaviour.py and tests/preload/off_mode.py,
            whose records must equal a plain stock-wheel process's.

Two adaptations of the fixture to the wheel are applied after the series
(WHEEL_ADAPTATIONS): the fixture's upstream revision differs from the wheel's
in two declarations the series does not touch.

Compiles run MAX_JOBS (default 2) at a time, niced; objects are kept in
BUILD/obj under a hash of their source and flags (nothing outside BUILD).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

import torch
from torch.utils.cpp_extension import include_paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tools", "patch_check")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import series_files  # noqa: E402

TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
TORCH_LIB = os.path.join(TORCH_DIR, "lib")
PATCHES = sorted(
    os.path.join(ROOT, "patches", "pytorch", f)
    for f in os.listdir(os.path.join(ROOT, "patches", "pytorch"))
    if re.match(r"\d{4}-.*\.patch$", f)
)

# The engine sources the series patches, linked into the preloaded library.
ENGINE_SOURCES = [
    "torch/csrc/autograd/input_buffer.cpp",
    "torch/csrc/autograd/input_metadata.cpp",
    "torch/csrc/autograd/functions/accumulate_grad.cpp",
    "torch/csrc/autograd/engine.cpp",
]
NEW_SOURCES = ["torch/csrc/autograd/semiring.cpp"]  # the series' own: -Werror
BINDINGS_SOURCE = "torch/csrc/autograd/init.cpp"

# (file, what the fixture has, what the wheel's headers need, why): applied to
# the tree after the series. Each must match exactly once.
WHEEL_ADAPTATIONS = [
    ("torch/csrc/autograd/engine.cpp",
     "void Engine::add_thread_pool_task(std::weak_ptr<GraphTask> graph_task) {",
     "void Engine::add_thread_pool_task(const std::weak_ptr<GraphTask>& graph_task) {",
     "the wheel's engine.h declares add_thread_pool_task(const std::weak_ptr<GraphTask>&)"),
    ("torch/csrc/autograd/init.cpp",
     re.compile(r'\n      \.def\(\n          "typed_metadata",\n.*?          \}\)', re.S),
     "",
     "the wheel's KinetoEvent has no typedMetadata()"),
]

CXX = os.environ.get("CXX", "g++")
WHEEL_INCLUDES = [f for p in include_paths() for f in ("-isystem", p)]
COMMON = ["-std=c++20", "-fPIC", "-O1", "-g0", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DAT_PER_OPERATOR_HEADERS"]
STRICT = ["-Wall", "-Wextra", "-Werror"]
PYTHON_INCLUDES = ["-isystem", sysconfig.get_paths()["include"]]


def say(stage: str, text: str) -> None:
    print(f"patch-check [{stage}] {text}", flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(f"$ {' '.join(cmd)}\n{r.stdout[-8000:]}{r.stderr[-8000:]}\n")
        raise SystemExit(f"patch-check: failed: {' '.join(cmd[:3])} …")
    return r


def git(tree, *args) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="patch-check", GIT_AUTHOR_EMAIL="patch-check@localhost",
               GIT_COMMITTER_NAME="patch-check", GIT_COMMITTER_EMAIL="patch-check@localhost")
    return run(["git", "-C", tree, *args], env=env).stdout


# ---- 1. apply ------------------------------------------------------------------

def wheel_copy(path: str):
    """The wheel's own file for an upstream path, if the wheel ships it (torch/**/*.py)."""
    if path.startswith("torch/") and path.endswith(".py"):
        candidate = os.path.join(TORCH_DIR, path[len("torch/"):])
        if os.path.isfile(candidate):
            return candidate
    return None


def apply_series(preimage: str, tree: str) -> dict:
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(preimage, tree, ignore=shutil.ignore_patterns("README.md"))
    for root, dirs, files in os.walk(tree):  # the fixture is read-only
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    changed = set()
    for patch in PATCHES:
        changed |= set(series_files.file_diffs(open(patch, encoding="utf-8").read()))
    from_wheel = []
    for path in sorted(changed):
        src = wheel_copy(path)
        if src and os.path.exists(os.path.join(tree, path)):
            shutil.copyfile(src, os.path.join(tree, path))
            from_wheel.append(path)
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "pre-image")
    git(tree, "am", "-q", *PATCHES)
    commits = git(tree, "rev-list", "--reverse", "HEAD~%d..HEAD" % len(PATCHES)).split()
    checked = 0
    for patch, commit in zip(PATCHES, commits):
        for path, lines in series_files.file_diffs(open(patch, encoding="utf-8").read()).items():
            index = next(line for line in lines if line.startswith("index "))
            before, after = index.split()[1].split("..")
            want_before = "0" * 40 if set(before) == {"0"} else git(tree, "rev-parse", f"{commit}~1:{path}").strip()
            want_after = git(tree, "rev-parse", f"{commit}:{path}").strip()
            if not (want_before.startswith(before) and want_after.startswith(after)):
                raise SystemExit(f"patch-check: {os.path.basename(patch)}: the index line of {path} is {before}..{after}, "
                                 f"the blobs are {want_before[:len(before)]}..{want_after[:len(after)]}")
            checked += 1
    for path, before, after, why in WHEEL_ADAPTATIONS:
        full = os.path.join(tree, path)
        text = open(full, encoding="utf-8").read()
        count = len(before.findall(text)) if isinstance(before, re.Pattern) else text.count(before)
        if count != 1:
            raise SystemExit(f"patch-check: wheel adaptation of {path} ({why}) matched {count} times, expected 1")
        text = before.sub(after, text) if isinstance(before, re.Pattern) else text.replace(before, after)
        open(full, "w", encoding="utf-8").write(text)
    new = [p for p in changed if not os.path.exists(os.path.join(preimage, p))]
    say("apply", f"{len(PATCHES)} patches applied with git am to the pre-image ({len(changed)} files, "
                 f"{len(new)} new; from the wheel: {', '.join(from_wheel) or 'none'}); {checked} index lines "
                 f"match the blobs; {len(WHEEL_ADAPTATIONS)} wheel adaptations")
    return {"files": len(changed), "new": new}


# ---- 2.-4. compile ---------------------------------------------------------------

def compile_one(source: str, out_dir: str, flags: list[str], key_extra: str = "", syntax_only=False) -> str:
    key = hashlib.sha1(("\0".join([CXX, *flags, open(source, "rb").read().decode("utf-8", "replace"),
                                   key_extra, str(syntax_only)])).encode()).hexdigest()[:16]
    obj = os.path.join(out_dir, f"{os.path.basename(source)}-{key}.o")
    if not os.path.exists(obj):
        cmd = [CXX, *flags, "-c", source, "-o", obj + ".tmp"] if not syntax_only else [CXX, *flags, "-fsyntax-only", source]
        run(cmd, preexec_fn=lambda: os.nice(10))
        if syntax_only:
            open(obj + ".tmp", "w").close()
        os.replace(obj + ".tmp", obj)
    return obj


def check_layout(tree: str, build: str) -> str:
    for patch in PATCHES:
        for path, lines in series_files.file_diffs(open(patch, encoding="utf-8").read()).items():
            if path.endswith((".h", ".hpp", ".cuh")) and not any(l.startswith("new file mode") for l in lines):
                raise SystemExit(f"patch-check: {os.path.basename(patch)} changes the existing header {path}: "
                                 "the series must leave the wheel's struct layouts alone")
    printed = []
    for name, extra in [("wheel", []), ("patched", ["-I", tree])]:
        exe = os.path.join(build, f"struct_sizes_{name}")
        run([CXX, *COMMON, *STRICT, *extra, *WHEEL_INCLUDES, os.path.join(HERE, "struct_sizes.cpp"), "-o", exe,
             "-L", TORCH_LIB, f"-Wl,-rpath,{TORCH_LIB}", "-ltorch_cpu", "-lc10"], preexec_fn=lambda: os.nice(10))
        printed.append(run([exe]).stdout.strip())
    if printed[0] != printed[1]:
        raise SystemExit(f"patch-check: struct sizes differ: wheel {printed[0]} / patched {printed[1]}")
    say("layout", f"no existing header changed; sizes equal with and without the series: {printed[1]}")
    return printed[1]


def bindings_source(tree: str, build: str) -> str:
    """A Python extension running the lines patch 0001 adds to THPAutograd_initExtension."""
    added = series_files.added_lines(open(PATCHES[0], encoding="utf-8").read(), BINDINGS_SOURCE)
    includes = [line for line in added if line.startswith("#include")]
    body = [line for line in added if not line.startswith("#include")]
    text = "\n".join([
        f"// Generated by tools/patch_check/run.py from {os.path.basename(PATCHES[0])}: the lines it adds to",
        f"// THPAutograd_initExtension in {BINDINGS_SOURCE}, run on torch._C._autograd.",
        *includes,
        "#include <torch/csrc/utils/pybind.h>",
        "",
        "PYBIND11_MODULE(_ts_series_bindings, unused) {",
        "  (void)unused;",
        '  auto m = py::module_::import("torch._C").attr("_autograd").cast<py::module_>();',
        *body,
        "}",
        "",
    ])
    path = os.path.join(build, "series_bindings.cpp")
    open(path, "w", encoding="utf-8").write(text)
    return path


def build_libraries(tree: str, build: str, jobs: int, preimage: str) -> tuple[str, str, int]:
    obj_dir = os.path.join(build, "obj")
    os.makedirs(obj_dir, exist_ok=True)
    header = open(os.path.join(tree, "torch/csrc/autograd/semiring.h"), encoding="utf-8").read()
    tree_inc = ["-I", tree]
    # init.cpp includes ATen/NodeCreationHooks.h, which the wheel lacks: from the fixture, alone.
    compat = os.path.join(build, "compat", "ATen")
    os.makedirs(compat, exist_ok=True)
    shutil.copyfile(os.path.join(preimage, "aten/src/ATen/NodeCreationHooks.h"), os.path.join(compat, "NodeCreationHooks.h"))
    jobs_list = [(os.path.join(tree, s), COMMON + tree_inc + WHEEL_INCLUDES, False) for s in ENGINE_SOURCES]
    jobs_list += [(os.path.join(tree, s), COMMON + STRICT + tree_inc + WHEEL_INCLUDES, False) for s in NEW_SOURCES]
    jobs_list.append((os.path.join(HERE, "shim.cpp"), COMMON + STRICT + WHEEL_INCLUDES, False))
    init_flags = (COMMON + tree_inc + ["-I", os.path.dirname(compat)] + WHEEL_INCLUDES + PYTHON_INCLUDES +
                  ["-isystem", os.path.join(TORCH_DIR, "include", "kineto"), "-DUSE_KINETO"])
    jobs_list.append((os.path.join(tree, BINDINGS_SOURCE), init_flags, True))
    bindings_cpp = bindings_source(tree, build)
    jobs_list.append((bindings_cpp, COMMON + STRICT + tree_inc + WHEEL_INCLUDES + PYTHON_INCLUDES, False))
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        # the heaviest first, so that two cores stay busy
        order = sorted(jobs_list, key=lambda j: -os.path.getsize(j[0]))
        futures = {j[0]: pool.submit(compile_one, j[0], obj_dir, j[1], header, j[2]) for j in order}
        objects = {src: f.result() for src, f in futures.items()}
    engine = os.path.join(build, "libts_series_engine.so")
    engine_objects = [objects[os.path.join(tree, s)] for s in ENGINE_SOURCES + NEW_SOURCES]
    run([CXX, "-shared", "-o", engine, *engine_objects, objects[os.path.join(HERE, "shim.cpp")],
         "-L", TORCH_LIB, f"-Wl,-rpath,{TORCH_LIB}", "-Wl,--no-undefined", "-ltorch_cpu", "-lc10"])
    overlay = os.path.join(build, "overlay")
    os.makedirs(overlay, exist_ok=True)
    bindings = os.path.join(overlay, "_ts_series_bindings" + sysconfig.get_config_var("EXT_SUFFIX"))
    run([CXX, "-shared", "-o", bindings, objects[bindings_cpp], "-L", build, f"-Wl,-rpath,{build}",
         "-lts_series_engine", "-L", TORCH_LIB, f"-Wl,-rpath,{TORCH_LIB}", "-ltorch_python", "-ltorch_cpu", "-lc10"])
    units = len(jobs_list)
    say("compile", f"{units} translation units compiled against the wheel's headers in {time.time() - started:.0f} s "
                   f"(MAX_JOBS={jobs}; {len(ENGINE_SOURCES)} engine sources + {len(NEW_SOURCES)} new (-Werror) + shim "
                   f"→ {os.path.basename(engine)}; {BINDINGS_SOURCE} syntax-only; its added lines → "
                   f"{os.path.basename(bindings)} (-Werror))")
    return engine, overlay, units


# ---- 5. overlay ---------------------------------------------------------------------

def build_overlay(tree: str, overlay: str) -> None:
    top = os.path.join(overlay, "torch")
    shutil.rmtree(top, ignore_errors=True)
    os.makedirs(top)
    patched_py = {p for p in os.listdir(os.path.join(tree, "torch", "autograd")) if p.endswith(".py")}
    for name in os.listdir(TORCH_DIR):
        if name != "autograd":
            os.symlink(os.path.join(TORCH_DIR, name), os.path.join(top, name))
    os.makedirs(os.path.join(top, "autograd"))
    for name in os.listdir(os.path.join(TORCH_DIR, "autograd")):
        if name not in patched_py and name != "__pycache__":
            os.symlink(os.path.join(TORCH_DIR, "autograd", name), os.path.join(top, "autograd", name))
    for name in patched_py:
        shutil.copyfile(os.path.join(tree, "torch", "autograd", name), os.path.join(top, "autograd", name))
    shutil.copyfile(os.path.join(HERE, "sitecustomize.py"), os.path.join(overlay, "sitecustomize.py"))
    say("overlay", f"torch/autograd/{{{', '.join(sorted(patched_py))}}} from the patched tree over the wheel's torch")


# ---- 6. run -------------------------------------------------------------------------

def environment(engine: str | None, overlay: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    paths = ([overlay] if overlay else []) + [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "preload"),
                                              os.path.join(ROOT, "tests")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if engine:
        env["LD_PRELOAD"] = engine
    return env


def run_python(args, env, cwd=ROOT, timeout=1800) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-12000:] + r.stderr[-6000:])
        raise SystemExit(f"patch-check: failed: python {' '.join(args)}")
    return r


def pytest_counts(output: str) -> dict:
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)][-1]
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", last)}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.layout == b.layout and torch.equal(a.to_dense(), b.to_dense()))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def compare_with_stock(script: str, engine: str, overlay: str, build: str) -> int:
    records = []
    for name, env in [("stock", environment(None, None)), ("series", environment(engine, overlay))]:
        out = os.path.join(build, f"{os.path.splitext(os.path.basename(script))[0]}-{name}.pt")
        run_python([script, out], env, cwd=os.path.dirname(script))
        records.append(torch.load(out, weights_only=False))
    stock, series = records
    if "preloaded" in stock and not (series["preloaded"] and not stock["preloaded"]):
        raise SystemExit(f"patch-check: {os.path.basename(script)}: the series run was not preloaded")
    stock = stock.get("record", stock)
    series = series.get("record", series)
    stock.pop("loaded", None), series.pop("loaded", None)
    differ = [k for k in stock if k not in series or not same(stock[k], series[k])]
    if differ or stock.keys() != series.keys():
        raise SystemExit(f"patch-check: {os.path.basename(script)}: differs from the stock wheel in {differ}")
    return len(stock)


def run_checks(tree: str, engine: str, overlay: str, build: str) -> dict:
    env = environment(engine, overlay)
    probe = run_python(["-c", (
        "import torch, torch_semiring\n"
        "from torch_semiring import torch_integration\n"
        f"assert torch.autograd.__file__.startswith({overlay!r}), torch.autograd.__file__\n"
        "assert torch_integration.series_registered, 'torch_semiring did not register with the series'\n"
        "print(' '.join(torch.autograd.registered_semirings()))\n")], env)
    names = probe.stdout.split()
    say("run", f"torch-semiring registered {len(names)} semirings through the series' API: {' '.join(names)}")
    counts = {}
    r = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                    os.path.join(tree, "test", "test_autograd_semiring.py")], env, cwd=tree)
    counts["0004"] = pytest_counts(r.stdout)
    if counts["0004"].get("skipped") or counts["0004"].get("failed"):
        raise SystemExit(f"patch-check: patch 0004's tests: {counts['0004']}\n{r.stdout[-4000:]}")
    say("run", f"patch 0004 (test/test_autograd_semiring.py): {counts['0004']['passed']} passed")
    r = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "stock_engine_cases.py"], env,
                   cwd=os.path.join(ROOT, "tests", "preload"))
    counts["preload"] = pytest_counts(r.stdout)
    say("run", f"tests/preload/stock_engine_cases.py on the series' engine: {counts['preload'].get('passed', 0)} passed, "
               f"{counts['preload'].get('skipped', 0)} skipped (about the LD_PRELOAD interposer itself)")
    counts["stock"] = compare_with_stock(os.path.join(ROOT, "tests", "patch_check", "stock_behaviour.py"),
                                         engine, overlay, build)
    counts["models"] = compare_with_stock(os.path.join(ROOT, "tests", "preload", "off_mode.py"), engine, overlay, build)
    say("run", f"no semiring set: {counts['stock']} autograd behaviours (tests/patch_check/stock_behaviour.py) and "
               f"{counts['models']} model gradients (tests/preload/off_mode.py) equal the stock wheel's")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preimage", default=os.path.join(os.path.dirname(ROOT), "shared", "pytorch-preimage"))
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "patch-check"))
    parser.add_argument("--apply-only", action="store_true", help="stage 1 only (tools/build_wheel.sh --check)")
    args = parser.parse_args()
    if not os.path.isdir(args.preimage):
        raise SystemExit(f"patch-check: no pre-image at {args.preimage} (the fixture ../shared/pytorch-preimage "
                         "beside the checkout; pass --preimage DIR or PREIMAGE=DIR)")
    started = time.time()
    jobs = max(1, int(os.environ.get("MAX_JOBS", "2")))
    build = os.path.abspath(args.build)
    tree = os.path.join(build, "tree")
    os.makedirs(build, exist_ok=True)
    applied = apply_series(os.path.abspath(args.preimage), tree)
    if args.apply_only:
        return 0
    check_layout(tree, build)
    engine, overlay, units = build_libraries(tree, build, jobs, os.path.abspath(args.preimage))
    build_overlay(tree, overlay)
    counts = run_checks(tree, engine, overlay, build)
    print(f"patch-check: OK in {time.time() - started:.0f} s — {len(PATCHES)} patches applied ({applied['files']} files), "
          f"struct sizes unchanged, {units} translation units compiled, patched engine preloaded: "
          f"patch 0004 {counts['0004']['passed']} passed; stock_engine_cases {counts['preload'].get('passed', 0)} passed, "
          f"{counts['preload'].get('skipped', 0)} skipped; {counts['stock']} stock behaviours + {counts['models']} model "
          f"gradients equal to the stock wheel", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
