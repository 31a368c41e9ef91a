"""Small fixes to the Jupyter Book 1.x site: the footer's facts and two console errors of the theme stack.

The footer: the minillama version and the date of the notebooks' stored outputs.

`_config.yml` (html.extra_footer) holds the footer text with `{version}` and `{outputs_date}`. The version is
read from the literal `__version__` in minillama/__init__.py (no import, so no torch). The date is the latest
execution timestamp that nbclient records in the cells' metadata when `make execute` runs the notebooks;
notebooks executed elsewhere without timings fall back to the date of the last commit that touched them.

The console errors (each would greet every reader in the browser's console; tests/test_site.py checks none):
- sphinx-thebe's inline `const THEBE_JS_URL ...` script lands twice in every page with jupyter-book 1.0.4 and
  Sphinx 7.4, so the second declaration throws a SyntaxError; duplicate script entries are dropped per page.
- pydata-sphinx-theme logs "Got invalid theme mode" when `default_mode` is empty, which jupyter-book leaves
  it; html_context["default_mode"] is set to "auto" (follow the reader's system) unless given.
"""

import ast
import json
import re
import subprocess
from pathlib import Path


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


def setup(app):
    app.connect("config-inited", _fill_footer)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)  # after the themes add theirs
    return {"parallel_read_safe": True, "parallel_write_safe": True}
