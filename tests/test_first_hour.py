"""What a new user meets first (issue 25): the repository's licences, declared dependencies, ignored
build outputs, the Makefile's help, the test workflow, and the README's claims about them."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement_names(requirements) -> set[str]:
    return {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_licences_for_the_code_the_book_and_what_is_fetched():
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200] and PROJECT["license"] == "Apache-2.0"
    book = (ROOT / "LICENSE-BOOK.md").read_text()
    for named in ("CC BY 4.0", "creativecommons.org/licenses/by/4.0", "Llama 3 Community License", "llama-models",
                  "SmolLM2-135M-Instruct", "Apache License 2.0"):  # fmt: skip
        assert named in book, named
    licences = README.split("## Licences", 1)[1]
    assert "Apache" in licences and "CC BY 4.0" in licences and "Llama 3 Community License" in licences


def test_every_import_of_the_package_is_declared():
    """A third-party module the package imports is a runtime dependency or in the `book` extra (imported
    lazily, for the chapters); numpy is declared because `ml.save`/`ml.load` go through safetensors.torch."""
    declared = _requirement_names(PROJECT["dependencies"])
    extra = set().union(*(_requirement_names(deps) for deps in PROJECT["optional-dependencies"].values()))
    distribution = {"llama_models": "llama-models", "llama_cpp": "llama-cpp-python"}
    notebook_only = {"matplotlib_inline", "IPython", "myst_nb"}  # present wherever a notebook runs
    imported = set()
    for path in (ROOT / "minillama").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"minillama"} - notebook_only
    missing = {m for m in third_party if distribution.get(m, m).lower() not in declared | extra}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
    assert {"numpy", "gguf"} <= declared


def test_build_outputs_and_local_benchmarks_are_ignored_and_cleaned():
    ignored = set((ROOT / ".gitignore").read_text().split())
    assert {"build/", "dist/", "benchmarks/local/"} <= ignored
    clean = re.search(r"^clean:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert re.search(r"\bbuild\b", clean) and re.search(r"\bdist\b", clean)


def test_make_help_lists_every_target_the_readme_names():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    listed = set(re.findall(r"make ([\w-]+)", out))
    in_readme = set(re.findall(r"^make ([\w-]+)", README, re.M))
    for target in ("book", "test", "lint", "pytest", "nbval", "colab-test", "book-strict", "browser-test", "bench"):
        assert target in listed and target in in_readme, target
    assert in_readme <= listed, in_readme - listed


def test_a_workflow_runs_the_readme_test_command_on_push():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "test.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert "push" in triggers
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any(run.strip() == ".ci/run" for run in steps)  # .ci/run is `make test` (test_house checks it)


def test_the_readme_says_what_the_commands_need():
    for needed in ("npm", "chromium", ".ci/install-chromium", "make book TORCH_INDEX_URL=", "515 s", "half an hour",
                   ".venv/bin/python -m minillama", "benchmarks/local/", "ARGS=--publish", "torchao==0.18.0"):  # fmt: skip
        assert needed in README, needed
    assert "nothing else to install by hand" not in README
    assert "when its notebook lands" not in README
    snippet = re.search(r"```python\n(.*?)```", README.split("## Using the package", 1)[1], re.S).group(1)
    assert "print(tok.decode(out[0]))" in snippet and "torch.manual_seed(0)" in snippet


def test_a_python_without_the_dependencies_is_told_which_python_to_use(tmp_path):
    """The system Python in the repository root finds the package but not torch or einops: one message
    naming what is missing and `.venv/bin/python -m minillama`, not a traceback ending in `import einops`."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import minillama"
    run = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True)  # -S: no site-packages
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: minillama needs torch, einops") and ".venv/bin/python -m minillama" in last
