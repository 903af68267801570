"""The documentation: every public definition has a docstring that names its parameters, the docstrings'
examples run and print what they say, docs/api.md is what tools/gen_api_docs.py makes of them."""
from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("gen_api_docs", os.path.join(ROOT, "tools", "gen_api_docs.py"))
gen_api_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_api_docs)

DEFINITIONS = list(gen_api_docs.public_definitions())


def _documented():
    """(name, object) of every public definition and of its classes' public members."""
    for _, qualified, obj in DEFINITIONS:
        yield qualified, obj
        if inspect.isclass(obj):
            for name, member in gen_api_docs.members(obj):
                yield f"{qualified}.{name}", member


def _parameters(obj) -> list[str]:
    """The parameters a docstring must name: a function's, or a class's constructor's when the class defines
    it (its own __init__, or a dataclass's fields)."""
    if isinstance(obj, property):
        return []
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            return [f.name for f in dataclasses.fields(obj)]
        if "__init__" not in vars(obj):
            return []
    signature = inspect.signature(obj)
    return [name for name in signature.parameters if name not in ("self", "cls") and not name.startswith("_")]


def test_the_api_is_all_there():
    names = {qualified for _, qualified, _ in DEFINITIONS}
    for expected in ("torch_semiring.grad", "torch_semiring.Path", "torch_semiring.has_rule",
                     "torch_semiring.decompose.softmax", "torch_semiring.captum.SemiringSaliency",
                     "torch_semiring.render.text_html", "torch_semiring.explain.explain"):
        assert expected in names
    assert len(names) >= 45


@pytest.mark.parametrize("name, obj", list(_documented()), ids=[name for name, _ in _documented()])
def test_every_public_definition_has_a_docstring_naming_its_parameters(name, obj):
    target = obj.fget if isinstance(obj, property) else obj
    doc = inspect.getdoc(target) if not inspect.isclass(obj) else obj.__doc__
    assert doc and len(doc.strip()) > 20, f"{name} has no docstring"
    missing = [p for p in _parameters(obj) if not re.search(rf"\b{re.escape(p)}\b", doc)]
    assert not missing, f"{name}'s docstring does not name its parameter(s) {missing}"


def test_help_of_grad_documents_every_argument_and_semiring():
    import torch_semiring as ts

    doc = ts.grad.__doc__
    for argument in ("outputs", "inputs", "grad_outputs", "semiring", "retain_graph", "create_graph",
                     "allow_unused", "raw", "params", "Returns", "Raises", "Example"):
        assert argument in doc, argument
    for name in ts.semirings():
        assert f"``{name}``" in doc, name
    assert "nats" in doc and "natural log" in doc


def _examples():
    finder = doctest.DocTestFinder(recurse=False)
    for qualified, obj in _documented():
        target = obj.fget if isinstance(obj, property) else obj
        for test in finder.find(target, qualified, globs={}):
            if test.examples:
                yield qualified, test


EXAMPLES = list(_examples())


def test_the_main_functions_have_examples():
    with_examples = {name for name, _ in EXAMPLES}
    for name in ("torch_semiring.grad", "torch_semiring.semiring", "torch_semiring.top_paths",
                 "torch_semiring.has_rule", "torch_semiring.decomposed"):
        assert name in with_examples, name


@pytest.mark.parametrize("name, test", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_docstring_examples_run_as_written(name, test):
    import torch

    torch.manual_seed(0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=lambda text: sys.stdout.write(text))
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (printed above)"


def test_api_md_is_generated_from_the_docstrings():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_api_docs.py"), "--check"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    assert done.returncode == 0, done.stderr + " — run python tools/gen_api_docs.py and commit docs/api.md"
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    assert "### `torch_semiring.grad(outputs, inputs, grad_outputs=None, *, semiring" in text


def test_tutorial_notebook_executes(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="make build installs nbformat and nbclient")
    nbclient = pytest.importorskip("nbclient")
    # The kernel is a new process started in docs/: it must import this checkout's package.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(os.path.join(ROOT, "docs", "tutorial.ipynb"), as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), \
        "docs/tutorial.ipynb is committed without outputs"
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "docs")}}).execute()
    printed = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for output in cell.outputs)
    assert "count: 3.00000" in printed and "entropy: 1.09861" in printed
    assert "equals ts.grad: True" in printed
    assert "log p(' Paris' | text) = " in printed
    html = [output["data"]["text/html"] for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if "<span title=" in output.get("data", {}).get("text/html", "")]
    assert len(html) == 2  # the two coloured texts (MiniLM, SmolLM2)
