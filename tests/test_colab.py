"""The book outside the development venv: a plain `pip install`, and every notebook as Colab runs it.

Two virtual environments, cached under `.cache/` and rebuilt when the dependencies of `pyproject.toml`,
the pins of `requirements.txt` or the lists below change:

- `pip`: torch 2.13.0, then a plain `pip install` of a copy of the repository (non-editable). The
  README's "Using the package" snippet must run there and print what its comments say.
- `colab`: torch 2.13.0 and only the packages Colab ships preinstalled (`COLAB`), plus the book
  extra's dependencies (cached; minillama itself is uninstalled again). Each notebook is copied alone
  into an empty folder outside the checkout and executed top to bottom with nbclient in that venv's
  kernel. Its first cell installs minillama[book] from a copy of this checkout (`MINILLAMA_REPO`), the
  way it installs from GitHub in Colab.

The notebooks run with `MINILLAMA_GPU_BRANCHES=cpu`: the cells that only run on a GPU take their GPU
branch on the CPU with a small stand-in shape. One run covers both: the switch changes only those
branch conditions, every other cell runs as Colab runs it, and the CPU side of each branch is what
nbval executes and compares in the development venv.

Run by `make colab-test` (part of `make test`), not by the plain pytest target.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TORCH = "torch==2.13.0"
# what Colab has preinstalled among the packages the book uses (versions from requirements.txt)
COLAB = ["numpy", "matplotlib", "pandas", "transformers", "tqdm", "ipywidgets", "ipykernel"]
CELL_TIMEOUT = 600


def _pip(python: Path, *args: str) -> None:
    index = os.environ.get("TORCH_INDEX_URL")
    extra = ["--index-url", index, "--extra-index-url", "https://pypi.org/simple"] if index else []
    cmd = [str(python), "-m", "pip", "install", "-q", *args]
    if any(a.startswith("torch==") for a in args):
        cmd += extra
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, f"{' '.join(cmd[3:])} failed:\n{run.stderr[-3000:]}"


def _source_copy(dest: Path) -> Path:
    """What `pip install <repository>` sees: the package, pyproject.toml and README, outside the checkout."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "minillama", dest / "minillama", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _venv(name: str, build) -> Path:
    """A venv under .cache/, rebuilt when the dependencies in pyproject.toml, the pins of requirements.txt,
    this file's package lists or python change (not for other edits of pyproject.toml)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = (project["dependencies"], project.get("optional-dependencies"))
    pins = (ROOT / "requirements.txt").read_text()
    key = hashlib.sha256(repr((deps, pins, TORCH, COLAB, name, sys.version)).encode()).hexdigest()[:16]
    path = CACHE / f"{name}-venv"
    stamp = path / ".minillama-stamp"
    python = path / "bin" / "python"
    if not (stamp.is_file() and stamp.read_text() == key and python.exists()):
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        _pip(python, TORCH, "-c", str(ROOT / "requirements.txt"))
        build(python)
        stamp.write_text(key)
    return python


def _torch_version(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('torch').split('+')[0])"  # no local label
    return subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


# ---- a plain pip install --------------------------------------------------------------------------


def _readme_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using the package", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# after the README's snippet: a checkpoint of its model saved and loaded (safetensors.torch needs numpy, which
# only a declared dependency brings into a venv that holds torch alone) gives the same greedy tokens
SAVE_AND_LOAD = """
import tempfile
with tempfile.TemporaryDirectory() as folder:
    ml.save(model, folder)
    back = ml.load(folder, progress=False)
    again = ml.generate(back, [tok.encode("Hello", bos=True)], max_new_tokens=8, temperature=0.0)
assert len(out[0]) == 8 and again == out, (again, out)
print("saved and loaded the same model")
"""


def test_readme_snippet_runs_after_a_plain_pip_install(tmp_path):
    python = _venv("pip", lambda python: None)
    (tmp_path / "src").mkdir()
    src = _source_copy(tmp_path / "src")
    # minillama itself is reinstalled from this checkout on every run; its dependencies come with it
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "minillama"], check=True)
    _pip(python, str(src))
    assert _torch_version(python) == "2.13.0", "pip install of the repository replaced torch"
    snippet = _readme_snippet()
    run = subprocess.run(
        [str(python), "-c", snippet + SAVE_AND_LOAD], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"the README's package snippet failed:\n{run.stderr[-3000:]}"
    assert "NumPy" not in run.stderr, f"numpy is missing from the installed dependencies:\n{run.stderr[-3000:]}"
    # each `print(...)  # N` line of the snippet prints N, first; then the decoded text (random weights: any
    # text, possibly with newlines), then the save/load line
    expected = [m.group(1) for m in re.finditer(r"^print\(.*\)\s+# (\d+)", snippet, re.M)]
    assert expected, "the snippet has no print line with its expected value"
    assert run.stdout.startswith("\n".join(expected) + "\n"), run.stdout
    assert "print(tok.decode(out[0]))" in snippet, "the snippet shows what it generated"
    assert run.stdout.endswith("\nsaved and loaded the same model\n"), run.stdout


# ---- Colab ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """The Colab-like kernel: its python, a kernelspec for nbclient, and MINILLAMA_REPO for the first cell."""
    src = _source_copy(tmp_path_factory.mktemp("src"))

    def build(python):
        _pip(python, *COLAB, "-c", str(ROOT / "requirements.txt"))
        # the book extra's dependencies, cached with the venv; minillama itself is left to the notebooks
        _pip(python, f"{src}[book]", "-c", str(ROOT / "requirements.txt"))

    python = _venv("colab", build)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "minillama"], check=True)
    jupyter = tmp_path_factory.mktemp("jupyter")
    spec = jupyter / "kernels" / "colab"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "colab", "language": "python"})
    )
    return {"python": python, "jupyter": jupyter, "repo": f"file://{src}"}


def _first_line(cell) -> str:
    lines = [line for line in cell.source.splitlines() if line.strip() and not line.startswith("# NBVAL")]
    return lines[0][:80] if lines else ""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_as_in_colab(notebook, colab, tmp_path, monkeypatch):
    folder = tmp_path / notebook.stem  # the notebook alone, as Colab opens it
    folder.mkdir()
    shutil.copy2(notebook, folder / notebook.name)
    nb = nbformat.read(folder / notebook.name, as_version=4)
    monkeypatch.setenv("JUPYTER_PATH", str(colab["jupyter"]))
    monkeypatch.setenv("MINILLAMA_REPO", colab["repo"])
    monkeypatch.setenv("MINILLAMA_GPU_BRANCHES", "cpu")
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.setenv("PATH", f"{colab['python'].parent}{os.pathsep}{os.environ['PATH']}")
    for name in ("MINILLAMA_CHECKPOINT", "PYTHONPATH", "VIRTUAL_ENV"):
        monkeypatch.delenv(name, raising=False)
    client = NotebookClient(
        nb, kernel_name="colab", timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(folder)}}
    )
    start = time.perf_counter()
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            failure = None
            try:
                client.execute_cell(cell, index)
            except (CellExecutionError, CellTimeoutError) as error:
                ename = getattr(error, "ename", type(error).__name__)
                evalue = getattr(error, "evalue", str(error).splitlines()[0])
                failure = f"{notebook.name}, cell {index} ({_first_line(cell)!r}): {ename}: {evalue}"
            if failure:  # outside the except block: one line, no chained tracebacks
                pytest.fail(failure, pytrace=False)
    print(f"{notebook.name}: {time.perf_counter() - start:.0f} s in the Colab-like kernel")
    assert _torch_version(colab["python"]) == "2.13.0", f"{notebook.name}'s first cell replaced torch"


def test_the_first_cell_is_the_same_everywhere_and_installs_from_the_configured_repository():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    first = {
        p.name: next(c for c in nbformat.read(p, 4).cells if c.cell_type == "code").source for p in NOTEBOOKS
    }
    assert len(set(first.values())) == 1, f"the first code cells differ: {sorted(first)}"
    cell = next(iter(first.values()))
    assert f'"git+{url}"' in cell, f"the first cell does not default to the repository of _config.yml ({url})"
    assert "MINILLAMA_REPO" in cell and "minillama[book]" in cell
    # every module the cell checks for is installed by minillama[book]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~ ;\[]", r)[0].lower().replace("-", "_") for r in project["dependencies"]}
    declared |= {
        re.split(r"[<>=!~ ;\[]", r)[0].lower().replace("-", "_")
        for r in project["optional-dependencies"]["book"]
    }
    checked = re.search(r"needed = \(([^)]*)\)", cell).group(1)
    modules = [m.strip().strip('"') for m in checked.split(",") if m.strip()]
    assert modules[0] == "minillama" and set(modules[1:]) <= declared, (modules, sorted(declared))
