"""What the chapters' notebooks ask of the machine they run on: the device, and the GPU branches.

Some cells only run on a GPU (the real 8B checkpoint in chapter 6, the live GPU measurements of
chapters 7 and 8). A CPU would never execute them, so a typo there would reach GPU readers first. One
switch makes a CPU take those branches with a small stand-in shape, so the tests execute every line:

    MINILLAMA_GPU_BRANCHES=cpu   take the GPU branches on the CPU, with stand-in shapes

On a real GPU the switch changes nothing. A notebook writes `if ml.notebook.gpu_branch():` where it
would write `if device == "cuda":`, passes its real shape through `ml.notebook.stand_in(args)` and its
token count through `ml.notebook.tokens(n)`, and asks `ml.notebook.checkpoint()` for the checkpoint
folder (`MINILLAMA_CHECKPOINT`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import torch

from .config import MODELS, ModelArgs

SWITCH = "MINILLAMA_GPU_BRANCHES"
CHECKPOINT = "MINILLAMA_CHECKPOINT"
# the stand-in keeps the real model's structure (GQA groups, scaled RoPE, tied head or not) at a size a
# CPU runs in seconds even in bfloat16, which CPUs without bf16 matrix units compute slowly: the
# vocabulary shrinks too (a checkpoint stand-in keeps the real one, for the tokenizer)
STAND_IN = dict(
    dim=256, n_layers=2, n_heads=8, n_kv_heads=2, multiple_of=256, vocab_size=2048, max_seq_len=1024
)


def cpu_stand_in() -> bool:
    """True when `MINILLAMA_GPU_BRANCHES=cpu` asks a machine without CUDA to take the GPU branches."""
    value = os.environ.get(SWITCH, "").strip().lower()
    if value not in ("", "cpu"):
        raise ValueError(f"{SWITCH}={value!r} is not understood; set it to 'cpu' or leave it unset")
    return value == "cpu" and not torch.cuda.is_available()


def device() -> str:
    """The device a notebook computes on: "cuda" with a GPU, else "cpu" (the stand-in runs there too)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_branch() -> bool:
    """Whether a notebook takes its GPU branch: a GPU is present, or the CPU stands in for one."""
    return torch.cuda.is_available() or cpu_stand_in()


def gpu_memory() -> int:
    """Bytes of memory on GPU 0; under the CPU stand-in 0, so the branch for small cards runs too."""
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0


def stand_in(args: ModelArgs | str) -> ModelArgs:
    """`args` on a GPU; under the CPU stand-in, the same family at a CPU size (name says so)."""
    args = MODELS[args] if isinstance(args, str) else args
    if not cpu_stand_in():
        return args
    return args.replace(**STAND_IN, name=f"{args.name} (CPU stand-in)")


def tokens(n: int) -> int:
    """`n` new tokens to measure on a GPU; under the CPU stand-in at most 16 (bfloat16 steps are slow there)."""
    return min(n, 16) if cpu_stand_in() else n


def checkpoint(family: str = "llama-3.1-8b") -> str | None:
    """The folder in `MINILLAMA_CHECKPOINT`; under the CPU stand-in without one, a small random
    checkpoint of `family`'s structure (tied head or not) in a temporary folder, so the loading cell runs."""
    path = os.environ.get(CHECKPOINT)
    if path or not cpu_stand_in():
        return path or None
    from .checkpoint import save
    from .model import Transformer

    folder = Path(tempfile.mkdtemp(prefix="minillama-stand-in-"))
    with torch.random.fork_rng(devices=[]):  # the notebook's own random stream is left as it was
        torch.manual_seed(0)
        args = stand_in(family).replace(vocab_size=MODELS[family].vocab_size)  # the real tokenizer's ids
        save(Transformer(args).to(torch.bfloat16), folder)
    return str(folder)


# A figure is drawn at most FIGURE_WIDTH inches wide (96 px per inch in the browser) and shrinks to the
# column on a phone: a 390 px screen leaves 358 px, so text of FONT_PT points renders at
# FONT_PT * 96/72 * 358 / (FIGURE_WIDTH * 96) px ≈ 9.9 px for 12 pt at 6 in, and 11 pt at only ≈ 9.1 px
# (8.9 px once the saved figure's tight box grows a little): tick labels and legends stay at FONT_PT too.
# tests/test_site.py measures every figure's smallest text and fails it below 9 px.
FIGURE_WIDTH = 6.0
FONT_PT = 12


def figures(width: float = FIGURE_WIDTH, height: float = 3.6) -> None:
    """Matplotlib as the book draws it: SVG with real text (vector, and measurable by the site test),
    figures `width` inches wide by default, text of `FONT_PT` points or more, so it stays legible at 390 px."""
    import matplotlib as mpl
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    if width > FIGURE_WIDTH:
        raise ValueError(f"width={width} in: the book's figures are at most {FIGURE_WIDTH} in wide (phones)")
    set_matplotlib_formats("svg", metadata={"Date": None})  # no timestamp: re-running changes nothing
    mpl.rcParams.update({
        "figure.figsize": (width, height),
        "svg.fonttype": "none",  # text stays text: searchable, measurable, sharp at any zoom
        "svg.hashsalt": "minillama",  # stable ids, so re-executing a notebook does not churn its SVG
        "font.size": FONT_PT,
        "axes.titlesize": FONT_PT,
        "axes.labelsize": FONT_PT,
        "xtick.labelsize": FONT_PT,
        "ytick.labelsize": FONT_PT,
        "legend.fontsize": FONT_PT,
        "figure.dpi": 96,
        "figure.constrained_layout.use": True,
    })


# a number, perhaps signed, with a % or × or a unit after a space ("15.0 GiB"); "8B" is a label
_NUMBER = re.compile(r"^[+\-−]?\.?\d[\d,]*(\.\d+)?(e[+-]?\d+)?(%|×)?( \S.*)?$")


class Table:
    """Rows a cell prints, shown as an HTML table in the book (its cells wrap, so it fits a 390 px phone) and as
    aligned text in a terminal or in `text/plain` (what nbval compares). Cells are strings, formatted by the
    caller; a column of numbers ("1,024", "-0.5%", "15.0 GiB") is right-aligned."""

    def __init__(self, header, rows, caption: str = ""):
        self.header = tuple(str(h) for h in header)
        self.rows = [tuple(str(c) for c in row) for row in rows]
        self.caption = caption
        bad = [row for row in self.rows if len(row) != len(self.header)]
        if bad:
            raise ValueError(f"a row has {len(bad[0])} cells, the header {len(self.header)}: {bad[0]}")

    @staticmethod
    def _numeric(cell: str) -> bool:
        return bool(_NUMBER.match(cell))

    def __repr__(self) -> str:
        widths = [max(len(r[i]) for r in [self.header, *self.rows]) for i in range(len(self.header))]
        right = [all(self._numeric(r[i]) for r in self.rows if r[i]) for i in range(len(self.header))]
        out = [self.caption] if self.caption else []
        for r in [self.header, *self.rows]:
            out.append("  ".join(c.rjust(w) if a else c.ljust(w) for c, w, a in zip(r, widths, right)).rstrip())
        return "\n".join(out)

    def _repr_html_(self) -> str:
        import html

        e = html.escape
        right = [all(self._numeric(r[i]) for r in self.rows if r[i]) for i in range(len(self.header))]
        align = ' style="text-align:right"'
        td = lambda tag, c, a: f"<{tag}{align if a else ''}>{e(c)}</{tag}>"  # noqa: E731
        out = ["<table class='ml-printed'>"]
        if self.caption:
            out.append(f"<caption>{e(self.caption)}</caption>")
        out.append("<thead><tr>" + "".join(td("th", h, a) for h, a in zip(self.header, right)) + "</tr></thead>")
        out.append("<tbody>")
        out += ["<tr>" + "".join(td("td", c, a) for c, a in zip(r, right)) + "</tr>" for r in self.rows]
        return "\n".join(out + ["</tbody></table>"])


def table(header, rows, caption: str = "") -> Table:
    """A printed table that fits a phone: `ml.notebook.table(["model", "GiB"], [["8B", "15.0"]])`."""
    return Table(header, rows, caption)
