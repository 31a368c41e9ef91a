"""Is a live measurement fit to print? A run made while a notebook executes, checked against the
committed benchmark results before a chapter presents it as a measurement (chapters 7-8).

A notebook's stored outputs come from whatever machine last executed it. On a shared machine a live
decode step can take ten or a hundred times what the committed run measured on the same kind of device,
and a page that printed it as "this machine, measured" would contradict the prose around it. So a live
run is compared with the committed run of the same model, dtype and device kind: every step time and
every matrix-vector time they share must lie within `tolerance` of the committed one (either way). When
one does not, the chapter says the machine was too busy (or, on another CPU than the committed run's, that
the check cannot tell a slower CPU from a busy one) and shows the committed numbers instead.

Not here: measuring (`runner.py`) or printing (`report.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

TOLERANCE = 3.0  # a live step this many times slower (or faster) than the committed one is not shown


@dataclass(frozen=True)
class LiveCheck:
    """The verdict on one live run: `ok` when it may be shown as a measurement; `reference` the committed
    results it was compared with (None when there are none of its kind); `worst` the largest factor
    between a live and a committed time (1.0 = identical); `reason` one sentence for the page."""

    ok: bool
    reference: dict | None
    worst: float
    reason: str


def reference_for(live: dict, committed: list[dict]) -> dict | None:
    """The newest committed results of the same model, dtype and device kind as `live`, or None."""
    same = [
        r
        for r in committed
        if r["machine"]["device"] == live["machine"]["device"]
        and r["config"]["model"] == live["config"]["model"]
        and r["config"]["dtype"] == live["config"]["dtype"]
    ]
    return same[-1] if same else None


def _factor(a: float, b: float) -> float:
    return max(a / b, b / a)


def _times(live_ms: float, committed_ms: float) -> str:
    r = live_ms / committed_ms
    # one decimal: "3 times as long ... beyond the factor of 3" would read as a contradiction at 3.2
    return f"{r:.1f} times as long as" if r >= 1 else f"1/{1 / r:.1f} of the time of"


def check_live(live: dict, committed: list[dict], tolerance: float = TOLERANCE) -> LiveCheck:
    """Compare each decode step time and matrix-vector time of `live` with the committed run of its kind.

    Without a committed run of its kind (e.g. a GPU, when only CPU results are committed) the run is
    shown if no variant beats its own measured ceiling, and the reason says it was not compared."""
    if tolerance <= 1:
        raise ValueError(f"tolerance={tolerance}: a factor above 1, e.g. {TOLERANCE}")
    runs = [r for r in live["runs"] if "decode_ms_per_token" in r]
    if not runs:
        raise ValueError("the live results hold no decode measurement to check (every run failed?)")
    ref = reference_for(live, committed)
    if ref is None:
        fastest = max(r["roofline_fraction"] for r in runs)
        ok = fastest <= 1.05
        what = f"{live['config']['model']} {live['config']['dtype']} on a {live['machine']['device']}"
        reason = (
            f"no committed run of {what} to compare with; "
            + ("no variant beats its own measured ceiling" if ok else
               f"a variant reached {fastest:.0%} of its own ceiling, which is impossible: not shown")
        )
        return LiveCheck(ok, None, 1.0, reason)
    by = {(r["variant"], r["batch"]): r for r in ref["runs"] if "decode_ms_per_token" in r}
    factors = {}
    for r in runs:
        c = by.get((r["variant"], r["batch"]))
        if c is None:
            continue
        pairs = [(f"{r['variant']} decode step", r["decode_ms_per_token"], c["decode_ms_per_token"])]
        if "matvec_ms" in r and "matvec_ms" in c:
            pairs.append(("matrix-vector products", r["matvec_ms"], c["matvec_ms"]))
        for name, a, b in pairs:
            factors[name] = (_factor(a, b), a, b)
    if not factors:
        raise ValueError(
            "the live run shares no variant and batch with the committed run of its kind; "
            "measure one of " + ", ".join(sorted({v for v, _ in by}))
        )
    what, (worst, live_ms, ref_ms) = max(factors.items(), key=lambda kv: kv[1][0])
    when = f"the committed run ({ref['machine']['name']}, {ref['machine']['date']})"
    if worst <= tolerance:
        reason = (
            f"every time it shares with {when} lies within a factor of {tolerance:g} "
            f"(the furthest, {what}: {worst:.1f}); this machine's run follows"
        )
        return LiveCheck(True, ref, worst, reason)
    here, there = live["machine"].get("name"), ref["machine"].get("name")
    if here and there and here != there:  # another CPU: a factor this large need not mean a busy machine
        reason = (
            f"this machine is not the committed run's CPU, and its {what} took {_times(live_ms, ref_ms)} in "
            f"{when}, beyond the factor of {tolerance:g} this page accepts: a slower CPU or a busy one, which "
            "this check cannot tell apart; the committed numbers follow"
        )
    else:
        reason = (
            f"this machine was too busy to measure: its {what} took {_times(live_ms, ref_ms)} in {when}, "
            f"beyond the factor of {tolerance:g} this page accepts; the committed numbers follow"
        )
    return LiveCheck(False, ref, worst, reason)


def subset(results: dict, variants, batches=(1,)) -> dict:
    """`results` with only the runs of `variants` at `batches` (and no headline), for printing with
    `bench.table` in place of a live run that failed its check."""
    keep = [r for r in results["runs"] if r["variant"] in set(variants) and r["batch"] in set(batches)]
    config = {**results["config"], "batches": [b for b in results["config"]["batches"] if b in set(batches)]}
    return {**{k: v for k, v in results.items() if k not in ("headline", "ratios")}, "runs": keep,
            "config": config}
