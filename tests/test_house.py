"""Facts about the repository itself, checked cheaply: the toc and the notebooks agree, the environment is
pinned, the README leads with its two commands, and the stored outputs are the outputs of one clean run."""

import ast
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from conftest import toc_files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


TOC_FILES = toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))


def _source(entry: str) -> Path | None:
    """The file a toc entry names (jupyter-book lets the suffix be left off)."""
    candidates = [ROOT / entry] if Path(entry).suffix else [ROOT / f"{entry}{s}" for s in (".md", ".ipynb")]
    return next((c for c in candidates if c.is_file()), None)


def test_every_toc_entry_exists():
    missing = [entry for entry in TOC_FILES if _source(entry) is None]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc_and_vice_versa():
    in_toc = {_source(e).relative_to(ROOT).as_posix() for e in TOC_FILES if _source(e) is not None}
    notebooks_in_toc = {p for p in in_toc if p.startswith("notebooks/")}
    on_disk = {nb.relative_to(ROOT).as_posix() for nb in NOTEBOOKS}
    assert on_disk - notebooks_in_toc == set(), f"notebooks missing from _toc.yml: {sorted(on_disk - in_toc)}"
    assert notebooks_in_toc - on_disk == set(), (
        f"_toc.yml lists absent notebooks: {sorted(notebooks_in_toc - on_disk)}"
    )


def test_chapters_are_numbered_in_toc_order():
    chapters = [Path(e).stem for e in TOC_FILES if e.startswith("notebooks/")]
    numbers = [int(re.match(r"(\d+)_", c).group(1)) if re.match(r"\d+_", c) else None for c in chapters]
    assert None not in numbers, f"chapter notebooks are named NN_topic.ipynb: {chapters}"
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), f"toc order: {chapters}"


def test_requirements_are_pinned_exactly():
    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [ln for ln in lines if ln and not ln.startswith("#")]
    unpinned = [r for r in reqs if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+==[A-Za-z0-9_.!]+", r)]
    assert not unpinned, (
        f"requirements.txt lines without an exact == pin (local labels like +cpu neither): {unpinned}"
    )
    assert "torch==2.13.0" in reqs, "torch must be pinned to exactly 2.13.0"
    names = [re.split(r"[=\[]", r)[0].lower().replace("_", "-") for r in reqs]
    assert len(names) == len(set(names)), "a package is pinned twice"
    for needed in ("jupyter-book", "nbval", "pytest", "ruff", "selenium", "llama-models", "transformers"):
        assert needed in names, f"requirements.txt lacks {needed}"


def test_makefile_installs_torch_first():
    makefile = (ROOT / "Makefile").read_text()
    torch_at = makefile.index("$(TORCH_PIN)")
    assert torch_at < makefile.index("-r requirements.txt") < makefile.index("-e ."), (
        "the Makefile installs torch==2.13.0, then requirements.txt, then the package"
    )
    assert "TORCH_PIN := torch==2.13.0" in makefile


def test_readme_leads_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    first_section = readme.split("\n## ", 2)[1] if "\n## " in readme else readme
    assert "make book" in first_section and "make test" in first_section, (
        "the two commands come first in the README"
    )


def test_ci_runs_the_readme_test_command():
    run = ROOT / ".ci" / "run"
    assert os.access(run, os.X_OK), ".ci/run must be executable"
    text = run.read_text()
    assert "set -euo pipefail" in text and "make test" in text


def test_gitignore_covers_build_outputs():
    ignored = set((ROOT / ".gitignore").read_text().split())
    for entry in (".venv/", ".cache/", "_build/", ".jupyter_cache/", "checkpoints/"):
        assert entry in ignored, f".gitignore lacks {entry}"


def test_version_is_a_literal():
    """pyproject.toml reads the version statically from minillama/__init__.py; a computed one breaks that."""
    tree = ast.parse((ROOT / "minillama" / "__init__.py").read_text())
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets)
    ]
    assert len(values) == 1 and isinstance(values[0], ast.Constant) and isinstance(values[0].value, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+", values[0].value)


def test_bibliography_entries_are_complete():
    from pybtex.database import parse_file

    entries = parse_file(str(ROOT / "book" / "references.bib")).entries
    assert len(entries) >= 7
    for key, entry in entries.items():
        assert entry.fields.get("title") and entry.persons.get("author"), f"{key}: title and authors"
        assert re.fullmatch(r"(19|20)\d\d", entry.fields.get("year", "")), f"{key}: year"
        has_id = re.fullmatch(r"\d{4}\.\d{4,5}", entry.fields.get("eprint", "")) or entry.fields.get("doi")
        assert has_id, f"{key}: an arXiv id (eprint) or a DOI"


def test_how_to_read_example_numbers():
    """The worked card example on the how-to-read page, recomputed from Meta's 8B configuration
    (dim 4096, 32 layers, 32 heads, 8 KV heads, meta-llama/llama-models sku_list.py)."""
    dim, n_layers, n_heads, n_kv_heads = 4096, 32, 32, 8
    hd = dim // n_heads
    per_block = 2 * dim * dim + 2 * dim * n_kv_heads * hd
    kv_per_token = 2 * n_layers * n_kv_heads * hd * 2
    page = (ROOT / "book" / "how_to_read.md").read_text()
    for number in (dim * dim, dim * n_kv_heads * hd, per_block, per_block * n_layers):
        assert f"{number:,}" in page, f"{number:,} missing from the worked example"
    assert kv_per_token == 128 * 1024 and "128 KiB per token" in page
    # the cache after the call is pasted from chapter 1, which computes it: its stored value must be this one
    assert "{glue:text}`../notebooks/01_parameter_accounting.ipynb::ch1_cache_mib:.1f` MiB" in page
    stored = _stored_glue(ROOT / "notebooks" / "01_parameter_accounting.ipynb")["ch1_cache_mib"]["text/plain"]
    assert f"{float(''.join(stored)):.1f}" == f"{kv_per_token * 1001 / 2**20:.1f}"
    assert f"{kv_per_token * 131072 // 2**30} GiB" in page


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_stored_outputs_are_one_clean_run(notebook):
    """Every code cell was executed, in order, in one kernel session (what `make execute` produces)."""
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in cells if "".join(c["source"]).strip()]
    assert None not in counts, f"{notebook.name}: cells never executed; run `make execute`"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{notebook.name}: execution counts {counts} are not 1..n"
    )
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{notebook.name}: code cell {i} stores an error"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_machine_paths(notebook):
    text = notebook.read_text()
    found = re.findall(r"(?:/work/|/root/|/home/[a-z]|/Users/[A-Za-z]|/tmp/ml)[^\s\"'\\]*", text)
    assert not found, f"{notebook.name} stores machine paths: {sorted(set(found))[:5]}"


# --- the conventions every chapter follows (BRIEF "Standards"; issue 14) ---------------------------------------
# Figures: each figure output is followed by a markdown caption cell `**Figure C.N —** …`, numbered in order.
# Exercises: each exercise N is followed by a markdown cell `:::{dropdown} Solution to exercise N` … `:::` and,
# right after it, a code cell that checks the answer with an `assert`. No stored output is a bare `True`/`False`
# where a number was the claim. Code lines stay within 100 characters (the site's column at 1280 px holds them).

MAX_CODE_LINE = 100
CAPTION = re.compile(r"\*\*Figure (\d+)\.(\d+) —\*\* \S")
SOLUTION = re.compile(r"\A:::\{dropdown\} Solution to exercise (\d+)\s*\n")
EXERCISES_HEADING = re.compile(r"^(#+)\s+Exercises\s*$", re.MULTILINE)
# a printed claim whose value is a bare boolean: a line that is `True`, or ends in `: True` (`claim: False` …)
BARE_BOOL = re.compile(r"^\s*(True|False)\s*$|:\s*(True|False)\s*$")


def _cells(notebook: Path) -> list[dict]:
    return [{**c, "text": "".join(c["source"])} for c in json.loads(notebook.read_text())["cells"]]


def _chapter(notebook: Path) -> int:
    return int(re.match(r"(\d+)_", notebook.name).group(1))


def _has_figure(cell: dict) -> bool:
    return any(
        "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
        for o in cell.get("outputs", [])
    )


def _exercise_section(cells: list[dict]) -> tuple[int, list[tuple[int, int]]]:
    """(index of the Exercises heading cell or -1, [(cell index, exercise number)] of the statements)."""
    start = next(
        (
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "markdown" and EXERCISES_HEADING.search(c["text"])
        ),
        -1,
    )
    if start < 0:
        return -1, []
    level = len(EXERCISES_HEADING.search(cells[start]["text"]).group(1))
    statements = []
    for i in range(start, len(cells)):
        cell = cells[i]
        if cell["cell_type"] != "markdown" or SOLUTION.match(cell["text"]):
            continue
        text = cell["text"]
        if i == start:
            text = text[EXERCISES_HEADING.search(text).end() :]
        elif re.match(rf"^#{{1,{level}}}\s", text):
            break  # the next section of the same or a higher level
        numbers = re.findall(r"^(\d+)\.\s", text, re.MULTILINE) + re.findall(r"\*\*Exercise (\d+)", text)
        statements += [(i, int(n)) for n in numbers]
    return start, statements


def _asserts(source: str) -> bool:
    code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    return any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(code)))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_are_numbered_and_captioned(notebook):
    cells, chapter, expected, problems = _cells(notebook), _chapter(notebook), 1, []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not _has_figure(cell):
            continue
        figures = sum(
            "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {}) for o in cell["outputs"]
        )
        if figures > 1:
            problems.append(f"cell {i} stores {figures} figures: one figure per cell, each with its caption")
        nxt = cells[i + 1] if i + 1 < len(cells) else None
        found = CAPTION.match(nxt["text"]) if nxt and nxt["cell_type"] == "markdown" else None
        if not found:
            problems.append(
                f"cell {i}'s figure is not followed by a caption cell '**Figure {chapter}.{expected} —** …'"
            )
        elif (int(found.group(1)), int(found.group(2))) != (chapter, expected):
            problems.append(
                f"cell {i + 1}: caption 'Figure {found.group(1)}.{found.group(2)}', "
                f"expected 'Figure {chapter}.{expected}'"
            )
        expected += 1
    assert not problems, f"{notebook.name}: " + "; ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_solution_and_a_check(notebook):
    cells = _cells(notebook)
    start, statements = _exercise_section(cells)
    assert start >= 0 and statements, f"{notebook.name}: no '## Exercises' section with numbered exercises"
    numbers = [n for _, n in statements]
    assert numbers == list(range(1, len(numbers) + 1)), f"{notebook.name}: exercises numbered {numbers}"
    solutions = {
        int(SOLUTION.match(c["text"]).group(1)): i
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown" and SOLUTION.match(c["text"])
    }
    problems = []
    for at, n in statements:
        if n not in solutions:
            problems.append(f"exercise {n} has no ':::{{dropdown}} Solution to exercise {n}' cell")
            continue
        i = solutions[n]
        if i < at:
            problems.append(f"the solution to exercise {n} (cell {i}) comes before the exercise (cell {at})")
        if not cells[i]["text"].rstrip().endswith(":::"):
            problems.append(f"the solution to exercise {n} (cell {i}) does not close its dropdown with ':::'")
        check = cells[i + 1] if i + 1 < len(cells) else None
        if not check or check["cell_type"] != "code" or not _asserts(check["text"]):
            problems.append(
                f"the solution to exercise {n} (cell {i}) is not followed by a code cell with an assert"
            )
    extra = sorted(set(solutions) - set(numbers))
    if extra:
        problems.append(f"solutions to exercises that do not exist: {extra}")
    assert not problems, f"{notebook.name}: " + "; ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_ones_nbval_reads(notebook):
    """nbval acts on a comment line only when the whole comment is a marker: "# NBVAL_IGNORE_OUTPUT (why)"
    is silently ignored, so the cell's varying output was compared after all (ch2's ablation glue failed on
    an AVX2 CPU by a last digit). Put the reason on a line of its own."""
    markers = {"NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP"}
    bad = []
    for i, cell in enumerate(_cells(notebook)):
        for line in "".join(cell["source"]).splitlines():
            comment = line.strip().lstrip("#").strip() if line.strip().startswith("#") else ""
            if "NBVAL_" in comment and comment not in markers:
                bad.append(f"cell {i}: {line.strip()!r}")
    assert not bad, f"{notebook.name}: comment lines nbval will not read as markers: {bad}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_output_is_a_bare_boolean(notebook):
    found = []
    for i, cell in enumerate(_cells(notebook)):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = "".join(out.get("text", ""))
            else:
                text = "".join(out.get("data", {}).get("text/plain", ""))
            found += [f"cell {i}: {ln.strip()[:80]!r}" for ln in text.splitlines() if BARE_BOOL.search(ln)]
    assert not found, f"{notebook.name}: print the number, not True/False: " + "; ".join(found)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(notebook):
    long = [
        f"cell {i} line {j + 1} ({len(ln)} characters)"
        for i, cell in enumerate(_cells(notebook))
        if cell["cell_type"] == "code"
        for j, ln in enumerate(cell["text"].splitlines())
        if len(ln) > MAX_CODE_LINE
    ]
    assert not long, f"{notebook.name}: code lines over {MAX_CODE_LINE} characters: " + "; ".join(long)


def _markdown_texts(notebook: Path):
    """The Markdown a notebook page renders: its markdown cells and its code cells' Markdown outputs."""
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            yield "".join(cell["source"])
        for out in cell.get("outputs", []):
            markdown = out.get("data", {}).get("text/markdown")
            if markdown:
                yield "".join(markdown)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_table_cells_escape_their_pipes(notebook):
    """A `|` inside a table cell splits the cell, even inside backticks (`<|eot_id|>`): it must be `\\|`."""
    broken = []
    for text in _markdown_texts(notebook):
        for line in text.splitlines():
            if not line.lstrip().startswith("|"):
                continue
            for span in re.findall(r"`[^`]*`", line):
                if re.search(r"(?<!\\)\|", span):
                    broken.append(span)
    assert not broken, f"{notebook.name}: unescaped | inside table cells: {broken[:5]}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_setup_cell_and_solution_checks_are_collapsed(notebook):
    """A reader sees the chapter first: the setup cell's code is collapsed (hide-input), and an exercise's checking
    cell, which prints the answer, stays behind its toggle (hide-cell) until the reader opens it."""
    cells = json.loads(notebook.read_text())["cells"]
    tags = [c.get("metadata", {}).get("tags", []) for c in cells]
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    assert "hide-input" in tags[first], f"{notebook.name}: the setup cell is not tagged hide-input"
    open_checks = [
        i + 1
        for i, c in enumerate(cells[:-1])
        if c["cell_type"] == "markdown"
        and SOLUTION.match("".join(c["source"]))
        and cells[i + 1]["cell_type"] == "code"
        and "hide-cell" not in tags[i + 1]
    ]
    assert not open_checks, f"{notebook.name}: solution checks shown uncollapsed in cells {open_checks}"


# --- numbers in prose come from the cells (issue 20) -------------------------------------------------------------
# A number that a cell computes or measures reaches the Markdown through myst-nb's glue, `{glue:text}`name:.2f``,
# so that re-executing a notebook updates its sentences. The test below fails a chapter whose Markdown types such a
# number by hand: a decimal (`1.35`), a percentage (`16 %`), a ratio (`3×`, `3x`), or a value with a unit of time,
# bandwidth, bytes or rate (`3.15 ms`, `31 GB/s`, `16 GiB`, `41 tok/s`). Not looked at: code (spans and fenced
# blocks), math (`$…$`, `$$…$$`, `{math}` roles and blocks), glue and other roles, link targets and URLs, HTML tags.
# Allowed anywhere: model and version names (GLOBAL_TYPED). Allowed in one notebook: the strings its metadata lists,
# `"minillama": {"typed_numbers": ["16 GiB", …]}`, for constants that follow from a configuration or a cited source
# (an entry the notebook's Markdown no longer uses fails the test, so the list cannot go stale).

# Notebooks whose owners are converting them to glue right now: expected to fail (xfail, not strict). Each owner
# removes their notebook from this set in the commit that makes it pass.
GLUE_PENDING: set[str] = set()

_UNIT = (
    # bandwidth and rate first (they contain the byte and time units)
    r"[kKMGTP]i?B/s|[kMGT]?bit/s|bytes?/s|B/s|tok(?:en)?s?/s|tokens? per second|it/s|steps?/s|"
    r"[kMGTP]?FLOP/s|[kMGTP]?FLOPS|[kMGT]?Hz|"
    r"[kKMGTP]i?B|bytes?|"  # bytes (a bare `B` is a model size, `8B`, not bytes)
    r"ns|µs|μs|us|ms|s|secs?|seconds?|minutes?|mins?|hours?|hrs?|days?"
)
_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
MEASURED = {
    "decimal": re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\.\d)"),
    "percentage": re.compile(_NUMBER + r"\s*(?:%|percent\b|per cent\b)"),
    # `3×` or `3× the bytes` is a ratio; `4,096 × 4,096` or `2 × d` a product of constants
    "ratio": re.compile(_NUMBER + r"(?:\s*×(?!\s*(?:[\d(\\$\x00]|[A-Za-z]\b))|x\b)"),
    "unit": re.compile(_NUMBER + r"\s*(?:" + _UNIT + r")(?![\w/])"),
}
# typed anywhere: model and version names, citations' identifiers, numbered figures, tables and sections
GLOBAL_TYPED = [
    r"Llama[- ]\d(?:\.\d)?(?:\s+\d+B)?",
    r"\bv?\d+\.\d+\.\d+(?:\.\w+)?\b",  # a three-part version (jupyter-book 1.0.4); never a measurement
    r"(?:torch|PyTorch|Python|transformers|jupyter-book|Jupyter Book|myst-nb|CUDA|gguf|numpy|tiktoken|einops"
    r"|torchao|llama-models|llama\.cpp|vLLM|safetensors|sentencepiece|Triton|cuDNN|NCCL|SmolLM|SmolLM2)"
    r"[ -]v?\d+(?:\.\d+)+",
    r"arXiv:?\s*\d{4}\.\d{4,5}(?:v\d+)?",
    r"\b(?:A100|H100|H200|H800|B200|A10G?|L40S?|V100|MI300X?)(?:[\s-]\d+\s?GB)?\b",  # GPU product names
    r"(?:Figures?|Fig\.|Tables?|Sections?|§|Equations?|Eq\.|Listings?|Exercises?|[Cc]hapters?)\s+"
    r"\d+(?:\.\d+)+(?:(?:\s*(?:,|and|or|/|–|-)\s*)\d+(?:\.\d+)+)*",
]
# stripped before looking, in this order (each match is blanked, keeping offsets so the sentence can be quoted)
_HIDDEN = [
    # fenced blocks: code, {math}, {glue:…} directives
    re.compile(r"^(`{3,}|~{3,})[\s\S]*?^\1", re.MULTILINE),
    re.compile(r"<!--[\s\S]*?-->"),
    re.compile(r"\$\$[\s\S]+?\$\$"),
    re.compile(r"(?<![\\\w])\$(?!\s)[^$\n]+?(?<![\s\\])\$"),
    re.compile(r"\{[\w:.-]+\}(`+)[\s\S]*?\1"),  # roles: {math}, {glue:text}, {cite}, {term}, …
    re.compile(r"(`+)[\s\S]*?\1"),  # code spans
    re.compile(r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)"),  # link targets
    re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$", re.MULTILINE),  # reference-style link definitions
    re.compile(r"<https?://[^>]+>|https?://[^\s)>\]]+"),
    re.compile(r"</?[A-Za-z][^>\n]*>"),  # HTML tags and their attributes (`width="80%"`)
    re.compile(r"^:[\w-]+:.*$", re.MULTILINE),  # directive options (`:width: 80%`)
]
BLANK = "\x00"


def _blank(text: str, pattern: re.Pattern | str) -> str:
    pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
    return pattern.sub(lambda m: BLANK * len(m.group(0)), text)


def _sentence(text: str, at: int) -> str:
    """The sentence of `text` around offset `at`, on one line."""
    ends = [m.end() for m in re.finditer(r"[.?!:](?=\s)|\n\s*\n", text)]
    start = max((e for e in ends if e <= at), default=0)
    end = min((e for e in ends if e > at), default=len(text))
    return " ".join(text[start:end].split())


def typed_numbers(text: str, allowed: list[str] = ()) -> list[tuple[str, str, str]]:
    """[(kind, the number as typed, its sentence)] for every measured-looking number typed in Markdown `text`
    outside code, math, roles, links and the allowed strings; used: the allowed strings that occur."""
    masked = text
    for pattern in _HIDDEN:
        masked = _blank(masked, pattern)
    for pattern in GLOBAL_TYPED:
        masked = _blank(masked, pattern)
    for string in allowed:  # the string as a whole, not inside a longer number (`1.3` does not allow `1.35`)
        masked = _blank(masked, r"(?<![\w.])" + re.escape(string) + r"(?!\w|\.\d)")
    found = []
    for kind, pattern in MEASURED.items():
        for m in pattern.finditer(masked):
            found.append((m.start(), kind, m.group(0).strip(), _sentence(text, m.start())))
    return [f[1:] for f in sorted(found)]


def _notebook_allow_list(notebook: Path) -> list[str]:
    meta = json.loads(notebook.read_text())["metadata"].get("minillama", {})
    allowed = meta.get("typed_numbers", [])
    assert isinstance(allowed, list) and all(isinstance(s, str) and s for s in allowed), (
        f"{notebook.name}: metadata minillama.typed_numbers must be a list of non-empty strings"
    )
    return allowed


def _pending(notebook: Path):
    if notebook.stem in GLUE_PENDING:
        reason = f"{notebook.stem} is being converted to glue (GLUE_PENDING in tests/test_house.py)"
        return pytest.param(notebook, marks=pytest.mark.xfail(reason=reason, strict=False), id=notebook.name)
    return pytest.param(notebook, id=notebook.name)


def test_glue_pending_names_existing_notebooks():
    stale = GLUE_PENDING - {nb.stem for nb in NOTEBOOKS}
    assert not stale, f"GLUE_PENDING names notebooks that do not exist: {sorted(stale)}"


@pytest.mark.parametrize("notebook", [_pending(nb) for nb in NOTEBOOKS])
def test_prose_types_no_measured_number(notebook):
    allowed, used, problems = _notebook_allow_list(notebook), set(), []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        used |= {s for s in allowed if s in text}  # a substring test: stale entries are the point
        problems += [
            f"cell {i}: {kind} {number!r} typed in: {sentence!r}"
            for kind, number, sentence in typed_numbers(text, allowed)
        ]
    unused = [s for s in allowed if s not in used]
    if unused:
        problems.append(f"metadata minillama.typed_numbers lists strings no Markdown cell uses: {unused}")
    assert not problems, (
        f"{notebook.name}: numbers typed by hand in the Markdown; glue the computed ones "
        "(`glue(name, value, display=False)` in the cell, {glue:text}`name:.2f` in the prose), or list a constant "
        "that follows from a configuration or a cited source in the notebook metadata minillama.typed_numbers:\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The step takes 3.15 ms here.", [("decimal", "3.15"), ("unit", "3.15 ms")]),
        ("It reads 31 GB/s, 16 % short.", [("unit", "31 GB/s"), ("percentage", "16 %")]),
        ("About 3× faster; 2x slower.", [("ratio", "3×"), ("ratio", "2x")]),
        ("It decodes 41 tok/s in 16 GiB.", [("unit", "41 tok/s"), ("unit", "16 GiB")]),
        (
            "Half of the time: 50% (10 s of 20 seconds).",
            [("percentage", "50%"), ("unit", "10 s"), ("unit", "20 seconds")],
        ),
        ("Shapes `4.5 ms`, $1.5$, $$2.5$$ and {glue:text}`x:.2f` ms.", []),
        ("Llama 3.1 8B and Llama 3.2 1B, Figure 3.2, jupyter-book 1.0.4, arXiv:2104.09864.", []),
        ("An A100 80GB and an H100 80 GB card; 80 GB is a size.", [("unit", "80 GB")]),
        ("A [link](https://x.org/a/1.5) and <https://y.org/2.5>, `d × d` and 4,096 × 4,096 weights.", []),
        ("```python\nx = 1.5\n```\nText.", []),
        ("```{math}\n1.5\n```\nand {math}`2.5`.", []),
    ],
)
def test_typed_numbers_finds_what_it_should(text, expected):
    assert [(k, n) for k, n, _ in typed_numbers(text)] == expected


def test_typed_numbers_allow_list_and_sentence():
    text = "The cache holds 16 GiB at full context (1.3 × 1.35).\n\nIt took 3.2 s on this machine."
    found = typed_numbers(text, allowed=["16 GiB", "1.3"])
    assert [(k, n) for k, n, _ in found][:1] == [("decimal", "1.35")]
    found = found[1:]
    assert [(k, n) for k, n, _ in found] == [("decimal", "3.2"), ("unit", "3.2 s")]
    assert found[0][2] == "It took 3.2 s on this machine."


# every glue role or directive in the Markdown pastes a value the notebook stores (a missing one renders as a
# warning and an empty span), and a `{glue:text}` format spec applies to the stored text (a numpy scalar's repr,
# `np.float64(1.5)`, does not format: glue a Python float)
GLUE_ROLE = re.compile(r"\{glue(?::(\w*))?\}`([^`]+)`")
GLUE_DIRECTIVE = re.compile(r"^(?:`{3,}|:{3,})\{glue(?::(\w*))?\}\s+(\S+)", re.MULTILINE)


def _stored_glue(notebook: Path) -> dict[str, dict]:
    stored = {}
    for cell in json.loads(notebook.read_text())["cells"]:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook")
            if meta:
                prefix = len(meta.get("mime_prefix", ""))
                stored[meta["name"]] = {k[prefix:]: v for k, v in out.get("data", {}).items()}
    return stored


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glue_role_has_a_stored_value(notebook):
    from myst_nb.core.variables import format_plain_text

    stored, problems = _stored_glue(notebook), []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        uses = [(m.group(1) or "", m.group(2)) for m in GLUE_ROLE.finditer(text)]
        uses += [(m.group(1) or "", m.group(2)) for m in GLUE_DIRECTIVE.finditer(text)]
        for kind, content in uses:
            if "::" in content:
                problems.append(f"cell {i}: {content!r} pastes from another document; glue it on this page")
                continue
            key, spec = content.rsplit(":", 1) if kind == "text" and ":" in content else (content, "")
            if key not in stored:
                problems.append(f"cell {i}: glue {key!r} is not stored in the notebook (re-execute it?)")
            elif kind == "text":
                if "text/plain" not in stored[key]:
                    problems.append(f"cell {i}: glue {key!r} has no text/plain to paste as text")
                    continue
                try:
                    format_plain_text("".join(stored[key]["text/plain"]), spec or "s")
                except (TypeError, ValueError) as exc:
                    problems.append(f"cell {i}: glue {key!r} does not format with {spec!r}: {exc}")
    assert not problems, f"{notebook.name}: " + "; ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_glue_names_are_unique(notebook):
    names = [
        out["metadata"]["scrapbook"]["name"]
        for cell in json.loads(notebook.read_text())["cells"]
        for out in cell.get("outputs", [])
        if "scrapbook" in out.get("metadata", {})
    ]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"{notebook.name}: glue names stored more than once: {twice}"


def test_front_page_links_every_chapter_and_how_to_get_real_weights():
    """The front page lists every chapter as a {doc} link (rendered with the notebook's own title, so it reads
    as the sidebar does), says where to start and how to open a chapter in Colab, and how to get real weights."""
    intro = (ROOT / "book" / "intro.md").read_text()
    linked = re.findall(r"\{doc\}`\.\./notebooks/(\w+)`", intro)
    assert sorted(set(linked)) == [nb.stem for nb in NOTEBOOKS], (
        f"chapters linked from the front page: {linked}"
    )
    assert "as they are written" not in intro, "the front page still says chapters appear as they are written"
    assert "## Start here" in intro and "colab.research.google.com/github/" in intro
    for needed in ('ml.fetch("smollm2-135m")', "Llama 3.2 1B", "GGUF", "Ollama", "LM Studio"):
        assert needed in intro, f"the front page does not say how to get real weights: {needed!r} missing"


# a role written inside a code span is not a role: ``{glue:text}`x` `` renders its own source, so the reader
# sees "{glue:text}" instead of the number (CommonMark's code spans, as MyST parses them, find it)
def _roles_in_code_spans(text: str) -> list[str]:
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").parse(text):
        for token in block.children or []:
            if token.type == "code_inline" and re.search(r"\{[\w:.-]+\}", token.content):
                found.append(token.content.strip())
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Peaks at {glue:text}`x:.1f` in {glue:text}`kind` rows.", []),
        ("the worst row of the `{glue:text}`kind`` matrices", ["{glue:text}"]),
        ("Cite {cite}`x` and write `code` and ``a `tick` ``.", []),
        ("A role inside ``{math}`x` `` shows its source.", ["{math}`x`"]),
    ],
)
def test_roles_in_code_spans_finds_what_it_should(text, expected):
    assert _roles_in_code_spans(text) == expected


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_role_is_written_inside_a_code_span(notebook):
    problems = []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            problems += [f"cell {i}: `{c}`" for c in _roles_in_code_spans("".join(cell["source"]))]
    assert not problems, (
        f"{notebook.name}: a role inside a code span renders as its source, not its value; "
        "take it out of the backticks: " + "; ".join(problems)
    )


def _sanitise(text: str) -> str:
    """A stored or fresh output as nbval compares it: tests/nbval_sanitize.cfg's rules in file order."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tests" / "nbval_sanitize.cfg")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


@pytest.mark.parametrize(
    ("stored", "fresh"),
    [  # pairs an AMD EPYC (AVX2) and an Intel Xeon (AVX-512) run of the same cell glued
        ("863.1141", "863.1145"),  # ch2: the largest |x| of a float32 forward
        ("29.0169", "29.0179"),  # ch2: a ratio of mean errors over that forward
        ("3.2154e-07", "3.2159e-07"),
        ("0.12345", "0.12349"),
        ("12345.678", "12345.9"),
    ],
)
def test_glued_floats_compare_to_four_significant_digits(stored, fresh):
    assert _sanitise(stored) == _sanitise(fresh)


@pytest.mark.parametrize(
    ("stored", "fresh"),
    [("863.1", "864.1"), ("29.01", "29.11"), ("1.523", "1.524"), ("0.1234", "0.1244"), ("12345.6", "12346.6"),
     ("-2.5", "2.5"), ("1.2e-07", "1.2e-08")],
)
def test_glued_floats_that_differ_in_four_digits_still_differ(stored, fresh):
    assert _sanitise(stored) != _sanitise(fresh)
