"""Combining and storing results: minillama-over-HF ratios, the headline, merging the parts of one
run, and the JSON files: `benchmarks/local/` for a local run, `benchmarks/results/` (what chapters 7-8
render) only when published.

Not here: measuring (`runner.py`) or printing and plotting (`report.py`).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
from pathlib import Path

RESULTS = Path("benchmarks") / "results"  # committed: what chapters 7-8 render (`--publish` writes here)
LOCAL = Path("benchmarks") / "local"  # git-ignored: a local run's default, which the book never reads


def ratios(results: dict) -> list[dict]:
    """minillama over HF, generate tok/s and decode tok/s, for every pair of variants at each batch."""
    rows = []
    for b in results["config"]["batches"]:
        runs = [r for r in results["runs"] if r["batch"] == b and "error" not in r]
        for ours in (r for r in runs if r["impl"] == "minillama"):
            for theirs in (r for r in runs if r["impl"] == "hf"):
                row = {"batch": b, "minillama": ours["variant"], "hf": theirs["variant"]}
                row["generate"] = ours["generate_tok_s"] / theirs["generate_tok_s"]
                if ours.get("part") == theirs.get("part"):  # measured in the same run
                    # repeat by repeat (the variants of a repeat run back to back), then the median
                    pairs = zip(ours["times_ms"]["generate"], theirs["times_ms"]["generate"])
                    row["generate_paired"] = statistics.median(t / o for o, t in pairs)
                if "decode_tok_s" in ours and "decode_tok_s" in theirs:
                    row["decode"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
                rows.append(row)
    return rows


def headline(results: dict) -> dict | None:
    """At the smallest batch: minillama's fastest variant over HF's fastest, by generate tok/s (end to
    end, prefill included, the same tokens), and minillama's `generate` over HF's default `generate`."""
    b = min(results["config"]["batches"])
    runs = [r for r in results["runs"] if r["batch"] == b and "error" not in r]
    ours = [r for r in runs if r["impl"] == "minillama"]
    if not ours:
        return None
    best = max(ours, key=lambda r: r["generate_tok_s"])
    head = {"batch": b, "minillama": best["variant"], "generate_tok_s": best["generate_tok_s"]}
    if "decode_tok_s" in best:
        head["roofline_fraction"] = best["roofline_fraction"]
        head["step_over_matvec"] = best["step_over_matvec"]
    theirs = [r for r in runs if r["impl"] == "hf"]
    if theirs:
        peer = max(theirs, key=lambda r: r["generate_tok_s"])
        head.update(hf=peer["variant"], hf_generate_tok_s=peer["generate_tok_s"])
        head["ratio"] = best["generate_tok_s"] / peer["generate_tok_s"]
    rows = results.get("ratios") or ratios(results)
    pair = {(r["minillama"], r["hf"]): r for r in rows if r["batch"] == b}
    if theirs and "generate_paired" in pair[(best["variant"], peer["variant"])]:
        head["ratio_paired"] = pair[(best["variant"], peer["variant"])]["generate_paired"]
    if ("generate", "hf") in pair:
        head["generate_over_hf"] = pair[("generate", "hf")]["generate"]
    return head


def merge_results(parts: list[dict]) -> dict:
    """One results dict from runs of the same model, dtype and lengths on one machine, e.g. the GPU
    script's parts, each run in its own process under its own time limit (the same seed gives the same
    weights). Runs are concatenated (a variant and batch measured twice keeps its first measurement),
    ratios and the headline recomputed across parts."""
    if not parts:
        raise ValueError("nothing to merge: pass at least one results dict")
    first = parts[0]
    keys = ("model", "dtype", "prompt_len", "new_tokens", "seed")
    for p in parts[1:]:
        differ = [k for k in keys if p["config"][k] != first["config"][k]]
        if p["machine"]["name"] != first["machine"]["name"]:
            differ.append("machine")
        if differ:
            raise ValueError(f"cannot merge results that differ in {', '.join(differ)}")
    out = json.loads(json.dumps(first))
    seen, runs, variants = set(), [], []
    for i, p in enumerate(parts):
        for r in p["runs"]:
            if (r["variant"], r["batch"]) not in seen:
                seen.add((r["variant"], r["batch"]))
                runs.append({**r, "part": i})
        variants += [v for v in p["config"]["variants"] if v not in variants]
    out["runs"] = runs
    out["config"]["variants"] = variants
    out["config"]["batches"] = sorted({b for p in parts for b in p["config"]["batches"]})
    out["config"]["repeats"] = max(p["config"]["repeats"] for p in parts)
    out["parts"] = [
        {k: p["config"][k] for k in ("variants", "batches", "repeats")} | {"wall_s": p.get("wall_s")}
        for p in parts
    ]
    out["ratios"] = ratios(out)
    out["headline"] = headline(out)
    out["wall_s"] = sum(p.get("wall_s") or 0 for p in parts)
    return out


def default_path(results: dict, publish: bool = False) -> Path:
    """`benchmarks/local/<machine>-<date>.json`, or with `publish` a new file under `benchmarks/results/`
    (the book's): `-2`, `-3`, ... is appended rather than replace a result already there."""
    m = results["machine"]
    if not publish:
        return LOCAL / f"{m['slug']}-{m['date']}.json"
    return fresh_path(RESULTS / f"{m['slug']}-{m['date']}.json")


def fresh_path(path: str | os.PathLike) -> Path:
    """`path` when no file is there, else the first free `<stem>-2<suffix>`, `-3`, ...: a second run on
    the same day on the same machine adds a result instead of replacing the committed one."""
    path = first = Path(path)
    n = 1
    while path.exists():
        n += 1
        path = first.with_name(f"{first.stem}-{n}{first.suffix}")
    return path


def save_results(results: dict, path: str | os.PathLike | None = None, publish: bool = False) -> Path:
    """Write `results` as JSON to `path` (default: `default_path(results, publish)`); the path written."""
    path = Path(path) if path is not None else default_path(results, publish)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def load_results(pattern: str = "benchmarks/results/*.json") -> list[dict]:
    """Committed results matching `pattern` (a glob), oldest first. A relative pattern is tried from
    the working directory, then from the repository this package sits in (notebooks run in notebooks/)."""
    paths = sorted(glob.glob(pattern))
    if not paths and not os.path.isabs(pattern):
        paths = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / pattern)))
    results = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if isinstance(r, dict) and "runs" in r and "machine" in r:
            results.append(r)
    return sorted(results, key=lambda r: r["machine"].get("time", r["machine"]["date"]))
