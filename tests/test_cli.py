"""The command line: `python -m minillama` runs, streams, counts, and turns bad arguments into exit code
2 with one line on stderr."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import random_model

import minillama as ml
from minillama.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "minillama", *argv],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_count_prints_the_published_total():
    result = run("count", "llama-3.1-8b")
    assert result.returncode == 0, result.stderr
    assert "8,030,261,248" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "×" in line]
    # aligned: every count ends in the same column
    assert len({len(line) for line in lines}) == 1


def test_generate_with_random_tiny_weights():
    result = run("generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "4", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert "random weights" in result.stderr
    assert "tok/s" in result.stderr
    assert result.stdout.strip()


def test_generate_from_a_checkpoint_greedy(tmp_path):
    args = ml.ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=64)
    model = random_model(args)
    ml.save(model, tmp_path)
    tok = ml.Tokenizer.default()
    want = ml.generate(model, ["hi"], max_new_tokens=5, tokenizer=tok)[0]
    result = run("generate", "--checkpoint", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "5",
                 "--temperature", "0", "--quiet")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == tok.decode(want) + "\n"


def test_bad_arguments_in_a_subprocess_exit_2_with_one_line():
    result = run("count", "llama-9")
    assert result.returncode == 2
    assert (
        result.stderr.count("\n") == 1
        and "llama-3.1-8b, llama-3.1-70b, llama-3.1-405b, tiny" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_bad_card_arguments_exit_2_with_one_line(capsys):
    from minillama.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["card", "attention", "--mode", "sideways"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "sideways" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--prompt", "hi"], "exactly one of --checkpoint DIR"),
        (["generate", "--model", "tiny"], "--prompt"),
        (
            ["generate", "--model", "gpt-5", "--prompt", "hi"],
            "unknown model 'gpt-5'; valid models: llama-3.1-8b",
        ),
        (
            ["generate", "--checkpoint", "no/such/dir", "--prompt", "hi"],
            "checkpoint directory not found: no/such/dir",
        ),
        (
            ["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "x"],
            "invalid int value: 'x'",
        ),
        (["generate", "--model", "tiny", "--prompt", "hi", "--dtype", "int4"], "invalid choice: 'int4'"),
        (["count"], "the following arguments are required: MODEL"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_bad_checkpoint_is_one_line_too(tmp_path, capsys):
    (tmp_path / "weights.gguf").write_bytes(b"")
    assert main(["generate", "--checkpoint", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights.gguf" in err and "GGUF" in err


def test_count_reads_a_checkpoint_config(tmp_path, capsys):
    model = random_model(
        ml.ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300, multiple_of=32)
    )
    ml.save(model, tmp_path)
    assert main(["count", str(tmp_path)]) == 0
    assert f"{ml.count_parameters(model.args).total:,}" in capsys.readouterr().out


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("generate", "count", "card", "bench"):
        assert command in out
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    for option in (
        "--checkpoint",
        "--chat",
        "--max-new-tokens",
        "--temperature",
        "--top-p",
        "--top-k",
        "--seed",
    ):
        assert option in out


@pytest.mark.parametrize("command, module", [("card", "cards"), ("bench", "bench")])
def test_delegated_commands(command, module, capsys):
    """`card` and `bench` hand their arguments to minillama.cards / minillama.bench; without the
    module, a one-line error."""
    import importlib.util

    if importlib.util.find_spec(f"minillama.{module}") is None:
        assert main([command]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"minillama.{module}" in err
        return
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: python -m minillama {command}" in capsys.readouterr().out


def test_generate_tp_outside_torchrun_names_the_launch(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun --nproc-per-node N -m minillama generate" in err
