"""The package as pip sees it: metadata, version, license and citation, the torch
it is built against and refuses to run without, and the optional extras (every
optional import names the extra that installs it)."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import torch
import yaml

import torch_semiring as ts
from torch_semiring import _build_info, explain, paths, render
from torch_semiring._extras import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "python", "torch_semiring")
PYPROJECT = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# The optional packages: those the feature extras install (all, test are unions).
OPTIONAL = {name: extra for extra, names in EXTRAS.items() if extra not in ("all", "test") for name in names}

sys.path.insert(0, os.path.join(ROOT, "tools"))
import build_backend  # noqa: E402


# -- metadata, version, license, citation --------------------------------------------------------------

def test_project_metadata():
    project = PYPROJECT["project"]
    assert project["name"] == "torch-semiring"
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    assert project["readme"] == "README.md" and project["authors"] and project["urls"]
    assert "Typing :: Typed" in project["classifiers"]
    assert set(project["dynamic"]) == {"version", "dependencies"}
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))
    # numpy and the extras' packages are declared; all is the union of the feature extras
    assert "numpy" in open(os.path.join(ROOT, "setup.py")).read()
    assert {"pandas", "matplotlib", "graphviz", "tqdm"} <= set(EXTRAS["viz"])
    assert {"transformers", "gguf", "accelerate"} <= set(EXTRAS["hf"]) and EXTRAS["captum"] == ["captum"]
    assert EXTRAS["all"] == ["torch-semiring[viz,hf,captum]"]


def test_build_requirements_hold_no_torch():
    system = PYPROJECT["build-system"]
    assert not any(re.match(r"torch\b", r) for r in system["requires"])
    assert system["build-backend"] == "build_backend" and system["backend-path"] == ["tools"]


def test_version_is_one_number_everywhere():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ts.__version__)
    citation = yaml.safe_load(open(os.path.join(ROOT, "CITATION.cff")))
    assert str(citation["version"]) == ts.__version__
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torch_semiring.__version__"}


def test_license_and_citation():
    assert open(os.path.join(ROOT, "LICENSE")).readline().strip() == "BSD 3-Clause License"
    citation = yaml.safe_load(open(os.path.join(ROOT, "CITATION.cff")))
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "BSD-3-Clause"
    paper = citation["preferred-citation"]
    assert paper["title"] == "Generalizing Backpropagation for Gradient-Based Interpretability"
    assert paper["doi"] == "10.18653/v1/2023.acl-long.669" and paper["year"] == 2023
    assert [a["family-names"] for a in paper["authors"]][0] == "Du"


# -- the torch it is built against ---------------------------------------------------------------------

def test_build_records_the_torch_it_compiled_against():
    assert _build_info.TORCH_VERSION == str(torch.__version__)


def test_torch_check_ignores_the_local_label():
    ts._check_torch("2.13.0+cpu", "2.13.0")
    ts._check_torch("2.13.0", "2.13.0+cu128")


def test_torch_check_refuses_another_release():
    with pytest.raises(ImportError) as error:
        ts._check_torch("2.13.0+cpu", "2.14.1")
    message = str(error.value)
    assert "built against torch 2.13.0+cpu" in message and "torch 2.14.1 is imported" in message
    assert "pip install --force-reinstall" in message and "make build" in message
    assert "pip install torch==2.13.0" in message


def test_import_refuses_a_different_torch():
    # The check runs before the extension loads: a clear message, not an undefined symbol.
    code = "import torch; torch.__version__ = '2.99.0'; import torch_semiring"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    assert run.returncode == 1
    assert f"built against torch {torch.__version__}, but torch 2.99.0 is imported" in run.stderr


def test_extension_is_stripped_unless_built_for_debugging():
    (so,) = [f for f in os.listdir(PACKAGE) if f.startswith("_C") and f.endswith(".so")]
    sections = _elf_section_names(os.path.join(PACKAGE, so))
    assert (".debug_info" in sections) == _build_info.DEBUG, sections
    assert (".symtab" in sections) == _build_info.DEBUG, sections  # -s drops the static symbol table


def _elf_section_names(path: str) -> set[str]:
    """Section names of a 64-bit little-endian ELF file (what `readelf -S` lists)."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    return {data[strtab + name:data.index(b"\0", strtab + name)].decode() for name, *_ in headers}


# -- the build backend ---------------------------------------------------------------------------------

def test_backend_finds_the_environments_torch():
    version, site = build_backend.target_torch(sys.executable)
    assert version == str(torch.__version__)
    assert os.path.dirname(torch.__file__) == os.path.join(site, "torch")
    build_backend.check((version, site), in_build_env=version)


def test_backend_refuses_an_old_torch():
    with pytest.raises(build_backend.TorchError) as error:
        build_backend.check(("2.12.1", "/env/site-packages"), python="/env/bin/python")
    message = str(error.value)
    assert "needs torch >= 2.13" in message and "/env/bin/python has torch 2.12.1" in message
    assert "pip install 'torch>=2.13'" in message


def test_backend_refuses_a_build_torch_other_than_the_installed_one():
    with pytest.raises(build_backend.TorchError) as error:
        build_backend.check(("2.13.0+cpu", "/env/site-packages"), in_build_env="2.15.0")
    message = str(error.value)
    assert "torch mismatch" in message and "torch 2.15.0" in message and "torch 2.13.0+cpu" in message
    assert "--no-build-isolation" in message


def test_backend_hook_refuses_an_environment_without_torch(tmp_path):
    # As pip runs it: an isolated build (setuptools on PYTHONPATH) for an interpreter whose
    # environment has no torch. The first hook stops with the fix, before anything compiles.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    setuptools_site = os.path.dirname(os.path.dirname(__import__("setuptools").__file__))
    run = subprocess.run([python, "-c", "import build_backend; build_backend.get_requires_for_build_wheel()"],
                         cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tools"),
                                                                            setuptools_site])})
    assert run.returncode == 1, run.stderr
    assert f"{python} has no torch installed" in run.stderr and "pip install torch" in run.stderr


def test_wheel_metadata_pins_the_torch_release_it_was_built_against(tmp_path):
    # The backend's metadata hook on a copy of the tree (setup.py writes build/ and _build_info.py).
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "__pycache__",
                                                             "*.egg-info", "demo_out", "explain_out", "reproduce",
                                                             "benchmarks"))
    meta = tmp_path / "meta"
    meta.mkdir()
    code = f"import build_backend; print(build_backend.prepare_metadata_for_build_wheel({str(meta)!r}))"
    run = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(src / "tools")})
    assert run.returncode == 0, run.stderr[-3000:]
    dist_info = run.stdout.strip().splitlines()[-1]
    metadata = (meta / dist_info / "METADATA").read_text()
    release = str(torch.__version__).split("+")[0]
    assert f"Requires-Dist: torch=={release}\n" in metadata and "Requires-Dist: numpy\n" in metadata
    assert f"Version: {ts.__version__}\n" in metadata and "License-Expression: BSD-3-Clause" in metadata
    for extra in ("viz", "hf", "captum", "all", "test"):
        assert f"Provides-Extra: {extra}\n" in metadata
    assert 'Requires-Dist: pandas; extra == "viz"' in metadata


# The folders whose files run as scripts (`python benchmarks/run.py`): Python puts the script's folder first on
# sys.path, so a file there named like an installed or standard module replaces it for everything the script
# imports. transformers 5.25 imports the `kernels` package (its dependency) whenever it is installed, and
# benchmarks/kernels.py (now gemm_kernels.py) broke every benchmark that loads a Hugging Face model.
SCRIPT_FOLDERS = ("benchmarks", "benchmarks/baselines", "tools", "tools/patch_check", "reproduce")
SHADOWS_ON_PURPOSE = {"sitecustomize"}  # tools/patch_check: loaded into the patched-engine process by design


def test_no_script_folder_shadows_an_installed_or_standard_module():
    import importlib.machinery
    ours = {ROOT, os.path.join(ROOT, "tests")} | {os.path.join(ROOT, f) for f in SCRIPT_FOLDERS}
    elsewhere = [p for p in sys.path if p and os.path.abspath(p) not in ours]  # site-packages, the standard library
    shadowing = []
    for folder in SCRIPT_FOLDERS:
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            module = name[:-3] if name.endswith(".py") else name if os.path.isfile(
                os.path.join(ROOT, folder, name, "__init__.py")) else None
            if module is None or module in SHADOWS_ON_PURPOSE:
                continue
            if (module in sys.builtin_module_names or module in sys.stdlib_module_names
                    or importlib.machinery.PathFinder.find_spec(module, elsewhere) is not None):
                shadowing.append(f"{folder}/{name}")
    assert not shadowing, f"rename these: they replace a module of the same name for the folder's scripts: {shadowing}"


# -- optional dependencies -----------------------------------------------------------------------------

def test_require_names_the_extra():
    with pytest.raises(ImportError, match=re.escape("pip install 'torch-semiring[viz]'")) as error:
        require("torch_semiring_no_such_package.sub", "viz")
    assert "'torch_semiring_no_such_package'" in str(error.value)


def test_require_passes_errors_from_inside_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "ts_broken_pkg.py").write_text("import ts_missing_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as error:
        require("ts_broken_pkg", "viz")
    assert error.value.name == "ts_missing_dependency_of_it"


def _path():
    return paths.Path(semiring="viterbi", value=0.0, input=0, rank=0)


# (missing package, the feature that needs it, called with the package hidden)
FEATURES = [
    ("pandas", "Path.to_dataframe", lambda tmp: _path().to_dataframe()),
    ("networkx", "Path.to_networkx", lambda tmp: _path().to_networkx()),
    ("pandas", "component_flow", lambda tmp: ts.component_flow(None, {})),
    ("pandas", "dataset_flow", lambda tmp: ts.dataset_flow([], None)),
    ("tqdm", "dataset_flow", lambda tmp: ts.dataset_flow([], None)),
    ("graphviz", "render.paths_graph", lambda tmp: render.paths_graph([])),
    ("matplotlib", "render.heatmap", lambda tmp: render.heatmap(None, "value", "x.png", "title")),
    ("transformers", "explain", lambda tmp: explain.explain(out=str(tmp))),
    ("tqdm", "explain", lambda tmp: explain.explain(out=str(tmp))),
    ("pandas", "explain", lambda tmp: explain.explain(out=str(tmp))),
    ("matplotlib", "explain", lambda tmp: explain.explain(out=str(tmp))),
    ("graphviz", "explain", lambda tmp: explain.explain(out=str(tmp))),
    ("pandas", "print_explanation", lambda tmp: explain.print_explanation(None, "viterbi")),
]


@pytest.mark.parametrize("missing,feature,call", FEATURES, ids=[f"{f}-without-{m}" for m, f, _ in FEATURES])
def test_a_feature_without_its_package_names_the_extra(missing, feature, call, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # explain sets it
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now fails as if not installed
    with pytest.raises(ImportError) as error:
        call(tmp_path)
    assert f"pip install 'torch-semiring[{OPTIONAL[missing]}]'" in str(error.value), (feature, str(error.value))


def _imports_and_requires(source: str):
    """The optional packages a module imports and its require() calls with literal
    arguments, each with its line and its enclosing scopes (functions, then the module)."""
    tree = ast.parse(source)
    imports, requires = [], []

    def visit(node, scopes):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                imports.extend((a.name.split(".")[0], child.lineno, scopes) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                imports.append((child.module.split(".")[0], child.lineno, scopes))
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None) == "require"
                  and len(child.args) == 2 and all(isinstance(a, ast.Constant) for a in child.args)):
                requires.append((child.args[0].value.split(".")[0], child.args[1].value, child.lineno, scopes))
            inner = scopes
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = (child.name,) + scopes
            visit(child, inner)

    visit(tree, ("<module>",))
    return [i for i in imports if i[0] in OPTIONAL], requires


def test_every_optional_import_goes_through_require():
    checked = 0
    for name in sorted(os.listdir(PACKAGE)):
        if not name.endswith(".py"):
            continue
        imports, requires = _imports_and_requires(open(os.path.join(PACKAGE, name)).read())
        for module, line, scopes in imports:
            # a require() of it earlier in the same function, or in a function (or module) around it
            assert any(m == module and l < line and s == scopes[len(scopes) - len(s):] for m, _, l, s in requires), \
                f"{name}:{scopes[0]} line {line} imports '{module}' without require('{module}', EXTRA) before it"
        for module, extra, line, scopes in requires:
            assert OPTIONAL.get(module) == extra, \
                f"{name}:{scopes[0]} line {line}: require('{module}', '{extra}'), but pyproject.toml's extra " \
                f"'{extra}' does not list {module}"
            checked += 1
    assert checked >= 10
