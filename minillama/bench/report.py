"""Reporting results: a text table, and matplotlib figures of the variants, the waterfall of what each
optimisation adds, and the batch sweep (chapters 7-8).

Each function reads a results dict (`runner.py` makes it, `results.py` loads and merges it) and
computes nothing new. Not here: measuring, or the JSON files.
"""

from __future__ import annotations

from .variants import WATERFALL


def bound_name(kind: str) -> str:
    """What a run's ceiling is called: on a CPU ("matvec") the step's own matrix-vector time, a kernel
    bound rather than a roofline of the memory bus (chapter 7); elsewhere the roofline."""
    return "kernel bound" if kind == "matvec" else "roofline"


def line(rec: dict) -> str:
    parts = [f"batch {rec['batch']:>3} {rec['variant']:<24}"]
    if "decode_tok_s" in rec:
        parts.append(
            f"decode {rec['decode_tok_s']:9.1f} tok/s {rec['decode_ms_per_token']:8.2f} ms/token "
            f"{rec['achieved_bytes_per_s'] / 1e9:7.1f} GB/s {100 * rec['roofline_fraction']:5.1f}% of {bound_name(rec['roofline'])} "
            f"{rec['step_over_matvec']:5.2f}x matvec"
        )
    parts.append(f"generate {rec['generate_tok_s']:9.1f} tok/s")
    if "prefill_tok_s" in rec:
        parts.append(f"prefill {rec['prefill_ms']:8.2f} ms")
    if rec.get("compile_s") is not None:
        parts.append(f"compile {rec['compile_s']:.1f} s")
    return "  ".join(parts)


def phone_table(results: dict):
    """The runs of `results` as a narrow table (an HTML table in the book, so a 390 px phone
    shows every column; aligned text in a terminal), captioned with the run's model and machine."""
    from ..notebook import table as narrow

    m, c = results["machine"], results["config"]
    rows = []
    for rec in results["runs"]:
        if "error" in rec or "generate_tok_s" not in rec:
            continue
        decode = f"{rec['decode_tok_s']:.1f}" if "decode_tok_s" in rec else ""  # `generate`: end to end only
        bound = f"{rec['roofline_fraction']:.0%}" if "roofline_fraction" in rec else ""
        prefill = f"{rec['prefill_ms']:.2f}" if "prefill_ms" in rec else ""
        rows.append([str(rec["batch"]), rec["variant"], decode, bound, f"{rec['generate_tok_s']:.1f}", prefill])
    kinds = {rec.get("roofline") for rec in results["runs"] if "roofline" in rec}
    name = bound_name(kinds.pop()) if len(kinds) == 1 else "bound"
    caption = (f"{c['model']} {c['dtype']}, prompt {c['prompt_len']} + {c['new_tokens']} new tokens, "
               f"median of {c['repeats']}; {m['name']}")
    return narrow(["B", "variant", "decode tok/s", f"of {name}", "generate tok/s", "prefill ms"], rows, caption)


def table(results: dict) -> str:
    """The results as text: the machine, the ceilings, a line per run, the headline ratio."""
    m, c = results["machine"], results["config"]
    lines = [
        (
            f"{c['model']} ({c['parameters']:,} parameters) {c['dtype']}, prompt {c['prompt_len']} + "
            f"{c['new_tokens']} new tokens, median of {c['repeats']}; {m['name']}, torch {m['torch']}"
        )
    ]
    ceil = results.get("ceilings") or {}
    if ceil:
        lines.append(
            f"copy bandwidth {ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s, {ceil['matmul_dtype']} matmul "
            f"{ceil['matmul_flops'] / 1e12:.2f} TFLOP/s"
        )
    for rec in results["runs"]:
        if "error" in rec:
            lines.append(f"batch {rec['batch']:>3} {rec['variant']:<24}{rec['error']}")
            continue
        lines.append(line(rec))
    for b in c["batches"]:
        rec = next((r for r in results["runs"] if r["batch"] == b and "matvec_ms" in r), None)
        if rec:
            lines.append(
                f"batch {b:>3} ceilings: matvec {rec['matvec_ms']:.2f} ms/step ({b / rec['matvec_ms'] * 1e3:.1f} tok/s), "
                f"{rec['bytes_per_step'] / 1e6:.1f} MB/step, {bound_name(rec['roofline'])} ({rec['roofline']}) {rec['roofline_tok_s']:.1f} tok/s"
            )
    head = results.get("headline")
    if head and "ratio" in head:
        lines.append(
            f"headline (batch {head['batch']}): minillama {head['minillama']} {head['generate_tok_s']:.1f} tok/s "
            f"/ HF {head['hf']} {head['hf_generate_tok_s']:.1f} tok/s = {head['ratio']:.2f}x"
            + (f" (paired by repeat {head['ratio_paired']:.2f}x)" if "ratio_paired" in head else "")
            + (
                f"; ml.generate / HF generate = {head['generate_over_hf']:.2f}x"
                if "generate_over_hf" in head
                else ""
            )
        )
    return "\n".join(lines)


def plot_results(results: dict, kind: str = "variants", batch: int | None = None, ax=None):
    """A matplotlib figure of one results dict.

    kind "variants": decode tok/s of every variant at `batch` (default the smallest) against the
    roofline; "waterfall": what each step (eager -> static cache -> compiled -> CUDA graphs) adds;
    "batch": tok/s and ms/token against batch size for each minillama variant, with the roofline."""
    import matplotlib.pyplot as plt

    if kind not in ("variants", "waterfall", "batch"):
        raise ValueError(f"kind={kind!r}; use 'variants', 'waterfall' or 'batch'")
    runs = [r for r in results["runs"] if "error" not in r]
    if kind == "batch":
        return _plot_batch(results, runs, ax)
    b = batch if batch is not None else min(results["config"]["batches"])
    runs = [r for r in runs if r["batch"] == b and "decode_tok_s" in r]
    if not runs:
        raise ValueError(f"no decode measurements at batch {b} in these results")
    fig, ax = plt.subplots() if ax is None else (ax.figure, ax)  # the size and text of rcParams
    roof = runs[0]["roofline_tok_s"]
    if kind == "variants":
        _plot_variants(ax, results, runs, b, roof)
    else:
        _plot_waterfall(ax, results, runs, b, roof)
    return fig


def _plot_variants(ax, results: dict, runs: list[dict], b: int, roof: float) -> None:
    """Decode tok/s of every variant at batch b, bars against the roofline."""
    names = [r["variant"] + (" (HF)" if r["impl"] == "hf" else "") for r in runs]
    values = [r["decode_tok_s"] for r in runs]
    colors = ["tab:orange" if r["impl"] == "hf" else "tab:blue" for r in runs]
    ax.barh(names, values, color=colors)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.0f} ({100 * v / roof:.0f}%)", va="center")
    ax.axvline(roof, color="k", ls="--", lw=1, label=f"{bound_name(runs[0]['roofline'])} ({runs[0]['roofline']}) {roof:.0f} tok/s")
    if runs[0]["roofline"] == "matvec" and "copy_roofline_tok_s" in runs[0]:
        copy = runs[0]["copy_roofline_tok_s"]
        ax.axvline(copy, color="0.35", ls="-.", lw=1.5, label=f"copy bandwidth {copy:.0f} tok/s")
    ax.set_xlabel("decode throughput (tokens/s)")
    ax.set_ylabel("variant")
    ax.set_xlim(0, max(values + [roof]) * 1.3)
    ax.set_title(f"Decode at batch {b}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25))


def _plot_waterfall(ax, results: dict, runs: list[dict], b: int, roof: float) -> None:
    """What each step of `WATERFALL` adds to the one before, at batch b."""
    by = {r["variant"]: r for r in runs}
    steps = [v for v in WATERFALL if v in by]
    if not steps:
        raise ValueError(f"the waterfall needs some of {', '.join(WATERFALL)}; these results have none")
    prev = 0.0
    for i, v in enumerate(steps):
        val = by[v]["decode_tok_s"]
        color = "tab:blue" if i == 0 else ("tab:green" if val >= prev else "tab:red")
        ax.bar(i, val - prev if i else val, bottom=prev if i else 0, color=color)
        ax.text(i, max(val, prev), f"{val:.0f}", ha="center", va="bottom")
        prev = val
    ax.axhline(roof, color="k", ls="--", lw=1, label=f"{bound_name(runs[0]['roofline'])} ({runs[0]['roofline']}) {roof:.0f} tok/s")
    ax.set_xticks(range(len(steps)), [_WATERFALL_LABELS[v] for v in steps])
    ax.set_xlabel("optimisation, each added to the one before")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_ylim(0, max(roof, prev) * 1.15)
    ax.set_title(f"What each step buys at batch {b}")
    ax.legend(loc="upper left")


_WATERFALL_LABELS = {
    "eager": "eager",
    "static": "+ static\ncache",
    "compile": "+ torch.\ncompile",
    "compile-reduce-overhead": "+ CUDA\ngraphs",
}


def plain_log_ticks(ax) -> None:
    """Label a log axis 1, 2, 4 or 10, 100 in the figure's own font size, not as 2^0 or 10^2, whose
    superscripts matplotlib draws at 0.7 of it (below the 9 px a phone reader is asked to read). A base-10
    axis spanning less than two decades is labelled at 1, 2 and 5 times each power of ten. Call it after
    the data are drawn (it reads the axis limits)."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log":
            continue
        lo, hi = sorted(axis.get_view_interval())
        if axis.get_transform().base == 10 and lo > 0 and math.log10(hi / lo) < 2:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        axis.set_minor_formatter(NullFormatter())


_BATCH_COLORS = {"eager": "tab:blue", "static": "tab:orange", "compile": "tab:green",
                 "compile-prefill": "tab:red", "generate": "tab:purple"}


def _plot_batch(results, runs, ax):
    """Tokens/s (top) and ms per step (bottom) against batch size, one panel per row so that neither
    shrinks on a phone; minillama's variants solid, Hugging Face's dashed and marked "(HF)"."""
    import matplotlib.pyplot as plt

    if ax is None:
        width = plt.rcParams["figure.figsize"][0]
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(width, 1.6 * width), sharex=True)
    else:
        fig, ax2 = ax.figure, None
    # the variants measured at more than one batch size
    names = [
        v
        for v in results["config"]["variants"]
        if len({r["batch"] for r in runs if r["variant"] == v and "decode_tok_s" in r}) > 1
    ]
    if not names:
        raise ValueError("no variant was measured at more than one batch size in these results")
    for v in names:
        rs = sorted((r for r in runs if r["variant"] == v and "decode_tok_s" in r), key=lambda r: r["batch"])
        bs = [r["batch"] for r in rs]
        hf = rs[0]["impl"] == "hf"
        # one colour per technique, shared by minillama's variant and Hugging Face's counterpart (dashed)
        color = _BATCH_COLORS.get(v.removeprefix("hf-") if hf and v != "hf" else ("eager" if hf else v))
        style = dict(marker="s" if hf else "o", ms=4, ls="--" if hf else "-", color=color,
                     label=v + (" (HF)" if hf else ""))
        ax.plot(bs, [r["decode_tok_s"] for r in rs], **style)
        if ax2 is not None:
            ax2.plot(bs, [r["decode_ms_per_token"] for r in rs], **style)
    roof = sorted({r["batch"]: r["roofline_tok_s"] for r in runs}.items())
    ax.plot([b for b, _ in roof], [t for _, t in roof], "k:", lw=1.5, label=bound_name(runs[0]["roofline"]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_ylabel("decode tok/s")
    ax.set_title("tokens per second, all sequences")
    if ax2 is None:  # one panel: it labels the batch axis and holds the legend
        ax.set_xlabel("batch size (sequences)")
        ax.legend()
    else:
        ax2.set_xscale("log", base=2)
        plain_log_ticks(ax2)
        ax2.set_xlabel("batch size (sequences)")
        ax2.set_ylabel("ms per step")
        ax2.set_title("time of one step (all B rows)")
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2)
    return fig
