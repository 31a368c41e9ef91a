"""The check a live benchmark run passes before a chapter prints it as a measurement (bench/sanity.py)."""

import copy

import pytest

from minillama.bench.sanity import check_live, reference_for, subset


def _results(device="cpu", model="tiny", dtype="float32", step_ms=5.0, matvec_ms=4.0, name="A"):
    run = {"variant": "static", "impl": "minillama", "batch": 1, "decode_ms_per_token": step_ms,
           "matvec_ms": matvec_ms, "roofline_fraction": matvec_ms / step_ms}
    return {"machine": {"device": device, "name": name, "date": "2026-12-01"},
            "config": {"model": model, "dtype": dtype, "batches": [1, 2]},
            "runs": [run, {**run, "batch": 2}], "headline": {"ratio": 1.0}, "ratios": []}


def test_a_run_like_the_committed_one_passes():
    check = check_live(_results(step_ms=6.0, matvec_ms=4.5), [_results()])
    assert check.ok and check.reference["machine"]["name"] == "A"
    assert check.worst == pytest.approx(1.2)


def test_a_busy_run_fails_and_names_the_factor():
    # 14x the committed step, as chapter 7's stored "live" row was
    check = check_live(_results(step_ms=70.0, matvec_ms=10.0), [_results()])
    assert not check.ok and check.worst == pytest.approx(14.0)
    assert "too busy" in check.reason and "14.0 times as long" in check.reason


def test_another_cpu_is_not_called_busy():
    # a different CPU 3x slower is not evidence of load: the reason says the check cannot tell which
    check = check_live(_results(step_ms=20.0, matvec_ms=16.0, name="B"), [_results()])
    assert not check.ok and "too busy" not in check.reason
    assert "not the committed run's CPU" in check.reason and "4.0 times as long" in check.reason


def test_a_run_much_faster_than_committed_fails_too():
    check = check_live(_results(step_ms=1.0, matvec_ms=1.0), [_results()])
    assert not check.ok and "1/5.0 of the time" in check.reason


def test_the_reference_is_of_the_same_kind_and_newest():
    old, new = _results(name="old"), _results(name="new")
    gpu = _results(device="cuda", name="gpu")
    assert reference_for(_results(), [old, gpu, new])["machine"]["name"] == "new"
    assert reference_for(_results(dtype="bfloat16"), [old, new]) is None


def test_without_a_reference_only_the_ceiling_is_checked():
    live = _results(device="cuda", dtype="bfloat16", step_ms=5.0, matvec_ms=4.0)
    check = check_live(live, [_results()])
    assert check.ok and check.reference is None and "no committed run" in check.reason
    impossible = _results(device="cuda", dtype="bfloat16", step_ms=2.0, matvec_ms=4.0)
    assert not check_live(impossible, [_results()]).ok


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="tolerance"):
        check_live(_results(), [_results()], tolerance=1.0)
    other = _results()
    for r in other["runs"]:
        r["variant"] = "compile"
    with pytest.raises(ValueError, match="shares no variant"):
        check_live(_results(), [other])


def test_subset_keeps_the_asked_runs_and_drops_the_headline():
    r = _results()
    before = copy.deepcopy(r)
    s = subset(r, ["static"], batches=(1,))
    assert [x["batch"] for x in s["runs"]] == [1] and "headline" not in s and s["config"]["batches"] == [1]
    assert r == before  # the committed results are left as they were
