"""The minillama site's additions to Jupyter Book 1.x: offline math, a wide content column, test markers out of the
reader's view, the footer's facts, and two console errors of the theme stack fixed.

Math offline. Sphinx loads MathJax 3 from a CDN by default; a reader offline (or this machine, which reaches no CDN)
then sees raw TeX. The build serves MathJax from the site instead: `make book` fetches the npm package
`mathjax@MATHJAX_VERSION` (by name and version, not committed here) into `.venv/mathjax/`; `mathjax_path` points at
its `tex-mml-chtml.js` under `_static/mathjax/`, and the package's `es5/` components and fonts are copied there after
the build. A build without it stops with an error that says how to get it.

A wide page. `book/_static/minillama.css` widens the content column (at 1200–1535 px the page's own contents move
from a fixed right column into the theme's "On this page" dialog) so 100-character code lines fit at 1280 px, and
wraps long text outputs instead of hiding them behind a horizontal scroll.

Test markers. `# NBVAL_IGNORE_OUTPUT` and the other `# NBVAL_*` lines tell nbval how to compare a cell; they are
removed from the displayed source of every code cell (the notebooks keep them).

The footer: the minillama version and the date of the notebooks' stored outputs. `_config.yml` (html.extra_footer)
holds the footer text with `{version}` and `{outputs_date}`. The version is read from the literal `__version__` in
minillama/__init__.py (no import, so no torch). The date is the latest execution timestamp that nbclient records in
the cells' metadata when `make execute` runs the notebooks; notebooks executed elsewhere without timings fall back
to the date of the last commit that touched them.

The console errors (each would greet every reader in the browser's console; tests/test_site.py checks none):
- sphinx-thebe's inline `const THEBE_JS_URL ...` script lands twice in every page with jupyter-book 1.0.4 and
  Sphinx 7.4, so the second declaration throws a SyntaxError; duplicate script entries are dropped per page.
- pydata-sphinx-theme logs "Got invalid theme mode" when `default_mode` is empty, which jupyter-book leaves
  it; html_context["default_mode"] is set to "auto" (follow the reader's system) unless given.
"""

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from docutils import nodes
from sphinx.errors import ConfigError

MATHJAX_VERSION = "3.2.2"  # the Makefile's MATHJAX_VERSION; tests/test_site.py checks the served copy
MATHJAX_ENTRY = (
    "tex-mml-chtml.js"  # the component Sphinx's CDN default loads: TeX and MathML in, HTML-CSS out
)
# the bundled components of es5/ other than the entry are not needed (MathJax loads extensions from input/, output/,
# a11y/, ui/, adaptors/ and sre/ on demand)
MATHJAX_SKIP = re.compile(r"^(?!tex-mml-chtml\.js$)[^/]+\.js$")
NBVAL_LINE = re.compile(r"^[ \t]*# ?NBVAL_[A-Z_]+.*(?:\n|$)", re.MULTILINE)


def _mathjax_dir(root: Path) -> Path:
    """Where `make book` unpacks the npm package (its es5/ folder); MINILLAMA_MATHJAX_DIR overrides."""
    return Path(os.environ.get("MINILLAMA_MATHJAX_DIR") or root / ".venv" / "mathjax")


def _version(root: Path) -> str:
    tree = ast.parse((root / "minillama" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "__version__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ValueError("minillama/__init__.py has no literal __version__ = '...'; the footer needs one")


def _outputs_date(root: Path) -> str:
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        return "no chapters yet"
    stamps = []
    for nb in notebooks:
        for cell in json.loads(nb.read_text()).get("cells", []):
            reply = cell.get("metadata", {}).get("execution", {}).get("shell.execute_reply")
            if reply and re.match(r"\d{4}-\d{2}-\d{2}", reply):
                stamps.append(reply[:10])
    if stamps:
        return max(stamps)
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", *[str(nb) for nb in notebooks]],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out = ""
    return out or "an unrecorded date"


def _fill_footer(app, config):
    root = Path(app.srcdir)
    options = dict(config.html_theme_options or {})
    footer = options.get("extra_footer", "")
    if "{version}" in footer or "{outputs_date}" in footer:
        options["extra_footer"] = footer.replace("{version}", _version(root)).replace(
            "{outputs_date}", _outputs_date(root)
        )
    config.html_theme_options = options
    # pydata-sphinx-theme reads the default colour mode from the template context, not the theme options
    config.html_context = {"default_mode": "auto", **(config.html_context or {})}
    # the site's stylesheet (book/_static/minillama.css) and favicon
    static = str(root / "book" / "_static")
    if static not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, static]


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # sphinx.builders.html._assets._JavaScript: a filename (None or "" when inline) and the tag's attributes
        key = (getattr(js, "filename", str(js)) or "", repr(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def _use_local_mathjax(app, config):
    """Point Sphinx at the site's own MathJax (unless a conf sets another non-CDN path on purpose)."""
    if config.mathjax_path and not str(config.mathjax_path).startswith(("http://", "https://")):
        return
    source = _mathjax_dir(Path(app.srcdir))
    found = source / "es5" / MATHJAX_ENTRY
    if not found.is_file():
        raise ConfigError(
            f"MathJax is not installed: {found} is missing. Run `make book` (it fetches the npm package "
            f"mathjax@{MATHJAX_VERSION} into .venv/mathjax), or unpack that package there yourself "
            "(npm pack mathjax@" + MATHJAX_VERSION + "; tar xzf mathjax-*.tgz; mv package .venv/mathjax)."
        )
    version = json.loads((source / "package.json").read_text()).get("version")
    if version != MATHJAX_VERSION:
        raise ConfigError(
            f"{source} holds MathJax {version}, the site pins {MATHJAX_VERSION}: remove it and run `make book`"
        )
    config.mathjax_path = f"mathjax/{MATHJAX_ENTRY}"


def _copy_mathjax(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    if str(app.config.mathjax_path) != f"mathjax/{MATHJAX_ENTRY}":
        return
    source = _mathjax_dir(Path(app.srcdir)) / "es5"
    target = Path(app.outdir) / "_static" / "mathjax"

    def skip(folder, names):
        return [n for n in names if Path(folder) == source and MATHJAX_SKIP.match(n)]

    shutil.copytree(source, target, ignore=skip, dirs_exist_ok=True)


def _refresh_static(app, exception):
    """Copy the site's own static files (book/_static) over the built ones: Sphinx 7.4 leaves a file it copied in an
    earlier build as it was, so an edited minillama.css would not reach an incremental build."""
    if exception is not None or app.builder.format != "html":
        return
    source = Path(app.srcdir) / "book" / "_static"
    target = Path(app.outdir) / "_static"
    for file in source.iterdir():
        if file.is_file():
            shutil.copy2(file, target / file.name)


def _strip_nbval_markers(app, doctree):
    """Remove `# NBVAL_*` lines from the displayed source of code cells (MyST-NB's `cell_input` containers)."""
    for container in doctree.findall(nodes.container):
        if "cell_input" not in container.get("classes", []):
            continue
        for block in container.findall(nodes.literal_block):
            text = block.astext()
            if "NBVAL_" not in text:
                continue
            cleaned = NBVAL_LINE.sub("", text)
            block.rawsource = cleaned
            block.children = []
            block += nodes.Text(cleaned)


SOURCE_PRINT = re.compile(r"\b(getsource(lines)?|reference_lines)\(")  # inspect's, and minillama.sources's


def _mark_source_outputs(app, doctree, docname):
    """A cell that prints source code (`inspect.getsource`, `ml.sources.reference_lines`) marks its text output
    `ml-source`: on a phone that output keeps its lines and scrolls sideways like code, while every other printed
    output wraps (book/_static/minillama.css)."""
    for cell in doctree.findall(nodes.container):
        if "cell" not in cell.get("classes", []):
            continue
        inputs = [c for c in cell.children if "cell_input" in c.get("classes", [])]
        if not any(SOURCE_PRINT.search(block.astext()) for c in inputs for block in c.findall(nodes.literal_block)):
            continue
        for output in cell.children:
            if "cell_output" in output.get("classes", []):
                for block in output.findall(nodes.literal_block):
                    block["classes"].append("ml-source")


FIGURE_CAPTION = re.compile(r"\AFigure \d+\.\d+ —")


def _figure_alt_text(app, doctree):
    """A figure's alt text is its caption (the markdown cell after the cell that drew it: `**Figure C.N —** …`),
    not the hashed file name MyST-NB gives an output image: screen readers and broken images then say what it shows."""
    for cell in doctree.findall(nodes.container):
        if "cell" not in cell.get("classes", []) or cell.parent is None:
            continue
        images = [im for im in cell.findall(nodes.image) if not im.get("alt") or im["alt"].endswith(".png")]
        if not images:
            continue
        siblings = cell.parent.children
        after = siblings[siblings.index(cell) + 1 :]
        caption = next((n for n in after if isinstance(n, nodes.paragraph)), None)
        if caption is None or not FIGURE_CAPTION.match(caption.astext()):
            continue
        for image in images:
            image["alt"] = caption.astext()


def _join_adjacent_streams(app, doctree, docname):
    """Consecutive prints that the notebook stored as separate outputs (a kernel may send a print's final newline
    on its own) are shown as one box, as a notebook shows them; prints separated by a table or a figure keep
    their place (`nb_merge_streams` is off in _config.yml because it moved every print above the first table)."""
    for output in doctree.findall(nodes.container):
        if "cell_output" not in output.get("classes", []):
            continue
        kept = None
        for child in list(output.children):
            stream = isinstance(child, nodes.literal_block) and "stream" in child.get("classes", [])
            if stream and kept is not None and child.get("classes") == kept.get("classes"):
                text = kept.astext() + child.astext()
                kept.children = [nodes.Text(text)]
                kept.rawsource = text
                output.remove(child)
            else:
                kept = child if stream else None


WORDS = re.compile(r"[A-Za-z]{3,}")


def _mark_pasted_words(app, doctree, docname):
    """A pasted value that is words, not a number (a glued clause such as "every request but the first"), is marked
    `pasted-words` and set in the body's weight: MyST-NB sets every pasted value in bold, and the book keeps bold for
    pasted numbers (book/how_to_read.md), so a clause no longer shouts in the middle of a sentence."""
    for node in doctree.findall(nodes.inline):
        if "pasted-text" in node.get("classes", []) and WORDS.search(node.astext()):
            node["classes"].append("pasted-words")


def setup(app):
    app.connect("config-inited", _fill_footer)
    app.connect("config-inited", _use_local_mathjax, priority=900)  # after sphinx.ext.mathjax's defaults
    app.connect("doctree-read", _strip_nbval_markers)
    app.connect("doctree-read", _figure_alt_text)
    app.connect("doctree-resolved", _mark_source_outputs)  # after MyST-NB renders the outputs
    app.connect("doctree-resolved", _join_adjacent_streams)
    app.connect("doctree-resolved", _mark_pasted_words)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)  # after the themes add theirs
    app.add_css_file("minillama.css")
    app.connect("build-finished", _copy_mathjax)
    app.connect("build-finished", _refresh_static)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
