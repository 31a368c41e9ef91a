"""The command line: `python -m minillama` runs, streams, counts, and turns bad arguments into exit code
2 with one line on stderr."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
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
    assert result.stderr.count("\n") == 1 and ", ".join(ml.MODELS) in result.stderr
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


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A saved model with the real vocabulary (so the real tokenizer and chat format apply)."""
    args = ml.ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=128)
    model = random_model(args, seed=3)
    path = ml.save(model, tmp_path_factory.mktemp("ckpt"))
    return model, path


def test_chat_wraps_the_prompt_in_the_instruct_format(small_checkpoint):
    model, path = small_checkpoint
    tok = ml.Tokenizer.default()
    dialog = tok.encode_dialog([{"role": "user", "content": "Name a colour."}])
    assert dialog[:2] == [tok.special_tokens["<|begin_of_text|>"], tok.special_tokens["<|start_header_id|>"]]
    want = ml.generate(model, [dialog], max_new_tokens=6, temperature=0.0, stop_tokens=tok.stop_tokens)[0]
    plain = ml.generate(
        model, ["Name a colour."], max_new_tokens=6, tokenizer=tok, stop_tokens=tok.stop_tokens
    )[0]
    assert want != plain  # the wrapping changes what the model sees
    result = run("generate", "--checkpoint", str(path), "--chat", "--prompt", "Name a colour.",
                 "--max-new-tokens", "6", "--temperature", "0", "--quiet")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == tok.decode(want) + "\n"


def test_a_progress_bar_while_the_checkpoint_loads(small_checkpoint):
    _model, path = small_checkpoint
    result = run("generate", "--checkpoint", str(path), "--prompt", "hi", "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    n = len(ml.Transformer(_model.args).state_dict())  # every tensor of the checkpoint, once
    assert "loading tensors: 100%" in result.stderr and f"{n}/{n}" in result.stderr


def test_generate_streams_each_piece_before_the_next_token(small_checkpoint, monkeypatch, capsys):
    """Text is printed as tokens arrive: before the generator makes token i+1, token i's text is out."""
    gen = sys.modules["minillama.generate"]  # the module (ml.generate is the function of the same name)
    _model, path = small_checkpoint
    real, seen = gen.generate, []

    def watched(*args, **kwargs):
        for token in real(*args, **kwargs):
            seen.append(capsys.readouterr().out)  # what was printed before this token existed
            yield token

    monkeypatch.setattr(gen, "generate", watched)
    argv = ["generate", "--checkpoint", str(path), "--prompt", "hi", "--max-new-tokens", "8",
            "--temperature", "0", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    rest = capsys.readouterr().out
    assert len(seen) == 8 and sum(bool(text) for text in seen[1:]) >= 4  # pieces came out one by one
    tok = ml.Tokenizer.default()
    want = ml.generate(_model, ["hi"], max_new_tokens=8, tokenizer=tok, stop_tokens=tok.stop_tokens)[0]
    assert "".join(seen) + rest == tok.decode(want) + "\n"


def _damaged(path, kind):
    if kind == "truncated safetensors":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
        return "model.safetensors"
    if kind == "bad config.json":
        (path / "config.json").write_text('{"hidden_size": ')
        return "config.json"
    if kind == "missing tensor":
        from safetensors.torch import load_file, save_file

        tensors = load_file(path / "model.safetensors")
        del tensors["model.layers.0.mlp.down_proj.weight"]
        save_file(tensors, path / "model.safetensors")
        return "down_proj"
    if kind == "truncated consolidated.00.pth":
        (path / "config.json").unlink()
        (path / "model.safetensors").unlink()
        (path / "params.json").write_text('{"dim": 64, "n_layers": 1, "n_heads": 4, "vocab_size": 128256}')
        (path / "consolidated.00.pth").write_bytes(b"PK\x03\x04 not a whole zip")
        return "consolidated.00.pth"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["truncated safetensors", "bad config.json", "missing tensor", "truncated consolidated.00.pth"]
)
def test_a_damaged_checkpoint_is_one_line_and_exit_2(kind, small_checkpoint, tmp_path, capsys):
    import shutil

    _model, path = small_checkpoint
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    named = _damaged(tmp_path, kind)
    assert main(["generate", "--checkpoint", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m minillama: error:") and named in err, err


def test_a_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    result = run("generate", "--checkpoint", str(tmp_path / "nowhere"), "--prompt", "hi")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "nowhere" in result.stderr


# ---- arguments checked before any weights are made or read; errors that name the real problem ------------


@pytest.fixture
def no_model(monkeypatch):
    """Building or loading a model fails the test: the checks under test must come first."""
    import minillama.__main__ as cli
    import minillama.checkpoint

    def boom(*args, **kwargs):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(cli, "random_model", boom)
    monkeypatch.setattr(minillama.checkpoint, "load", boom)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1"),
        (["--temperature", "-1"], "--temperature -1.0 must be >= 0 (0 is greedy)"),
        (["--top-p", "0"], "--top-p 0.0 must be in (0, 1]"),
        (["--top-k", "0"], "--top-k 0 must be at least 1"),
        (["--max-seq-len", "0"], "--max-seq-len 0 must be at least 1"),
        (["--system", "be brief"], "--system is a chat message: pass --chat too"),
    ],
)
def test_bad_settings_are_rejected_before_the_model_is_built(extra, message, no_model, capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "hi", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_prompt_longer_than_the_context_says_how_much_to_cut_before_building(no_model, capsys):
    tok = ml.Tokenizer.default()
    prompt = "hello " * 3000
    n = len(tok.encode(prompt, bos=True))  # the oracle: the tokenizer itself
    assert main(["generate", "--model", "tiny", "--prompt", prompt, "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    limit = ml.MODELS["tiny"].max_seq_len
    assert f"a prompt of {n} tokens + 8 new tokens needs {n + 7} cache positions, more than max_seq_len={limit}" in err
    assert f"cut the prompt by {n + 7 - limit} tokens" in err and "--max-new-tokens to" not in err  # 0 is no fix
    # a prompt that fits with fewer new tokens: both fixes, each exact; a lowered --max-seq-len: raise it
    argv = ["generate", "--model", "tiny", "--prompt", "hello " * 1000, "--max-new-tokens", "100", "--max-seq-len", "1050"]
    assert main(argv) == 2
    n = len(tok.encode("hello " * 1000, bos=True))
    err = capsys.readouterr().err
    assert f"cut the prompt by {n + 99 - 1050} tokens" in err and f"lower --max-new-tokens to {1050 - n + 1}" in err
    assert f"raise --max-seq-len (up to the model's {limit})" in err


def test_a_checkpoints_context_is_checked_from_its_config(small_checkpoint, no_model, capsys):
    _model, path = small_checkpoint  # max_seq_len 128
    assert main(["generate", "--checkpoint", str(path), "--prompt", "hi", "--max-new-tokens", "200"]) == 2
    assert "more than max_seq_len=128" in capsys.readouterr().err


def test_random_weights_that_do_not_fit_say_what_fits(monkeypatch, no_model, capsys):
    import minillama.__main__ as cli

    size8b = ml.count_parameters(ml.MODELS["llama-3.1-8b"]).total
    monkeypatch.setattr(cli, "_available_bytes", lambda device: int(size8b * 3))  # fits 16 bits, not 32
    assert main(["generate", "--model", "llama-3.1-8b", "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llama-3.1-8b with random weights in float32 needs about" in err
    assert f"{size8b * 4 / 1e9:.0f}" in err.split("needs about ")[1][:4]  # about 4 bytes per parameter
    assert "--dtype bfloat16" in err and "llama-3.2-1b" in err and "tiny" in err and "llama-3.1-70b (" not in err
    monkeypatch.setattr(cli, "_available_bytes", lambda device: 2 * 10**9)  # only tiny fits, in any dtype
    assert main(["generate", "--model", "llama-3.1-8b", "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--dtype bfloat16" not in err and "a smaller --model: tiny (" in err


def test_enough_memory_passes_the_check(monkeypatch):
    import minillama.__main__ as cli

    need = cli._model_bytes(ml.MODELS["tiny"], torch.float32, 10)
    monkeypatch.setattr(cli, "_available_bytes", lambda device: need + 1)
    cli._check_memory(argparse_ns(model="tiny"), ml.MODELS["tiny"], torch.device("cpu"), torch.float32, 10)
    monkeypatch.setattr(cli, "_available_bytes", lambda device: need - 1)
    with pytest.raises(cli.UsageError):
        cli._check_memory(argparse_ns(model="tiny"), ml.MODELS["tiny"], torch.device("cpu"), torch.float32, 10)


def argparse_ns(**kwargs):
    import argparse

    return argparse.Namespace(**kwargs)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["count", "meta-llama/Llama-3.1-8B"], "hub ids are not fetched, download it"),
        (["generate", "--checkpoint", "meta-llama/Llama-3.1-8B", "--prompt", "hi"], "--checkpoint DIR"),
        (["generate", "--model", "meta-llama/Llama-3.1-8B", "--prompt", "hi"], "looks like a Hugging Face hub id"),
        (["count", "/no/such/checkpoint"], "no such checkpoint folder: /no/such/checkpoint"),
        (["count", "llama-3.1-8B"], "did you mean 'llama-3.1-8b'?"),
        (["generate", "--model", "llama-3.2-1B", "--prompt", "hi"], "did you mean 'llama-3.2-1b'?"),
    ],
)
def test_names_and_paths_errors_name_the_real_problem(argv, message, no_model, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_file_where_a_folder_is_expected(small_checkpoint, no_model, capsys):
    _model, path = small_checkpoint
    weights = path / "model.safetensors"
    for argv in (["count", str(weights)], ["generate", "--checkpoint", str(weights), "--prompt", "hi"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{weights} is a file" in err and f"pass {path}" in err and "not found" not in err


def test_version_and_defaults_in_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip().startswith(f"minillama {ml.__version__} (torch ")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("most tokens to generate (default: 128)", "(default: 0.6)", "(default: 0.9)", "(default: auto)"):
        assert shown in out


def test_card_takes_a_checkpoint_folder_like_count(small_checkpoint, capsys):
    from minillama.cards import card

    model, path = small_checkpoint
    assert main(["card", "attention", "--model", str(path), "--mode", "decode", "--positions", "10"]) == 0
    out = capsys.readouterr().out
    assert out == str(card("attention", model.args, mode="decode", positions=10, batch="B")) + "\n"
    with pytest.raises(SystemExit):
        main(["card", "attention", "--model", "llama-3.1-8B"])
    assert "did you mean 'llama-3.1-8b'?" in capsys.readouterr().err


def test_bench_without_transformers_suggests_variants_without_hf_peers(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    assert main(["bench", "--variants", "eager,hf", "--new-tokens", "2", "--no-save", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need transformers" in err and "--variants eager" in err
