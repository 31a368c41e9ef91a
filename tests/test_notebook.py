"""The notebooks' machine switch: MINILLAMA_GPU_BRANCHES=cpu takes the GPU branches on a CPU, with stand-ins."""

import pytest
import torch

import minillama as ml
from minillama import notebook

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the switch changes nothing")


def test_without_the_switch_a_cpu_skips_the_gpu_branches(monkeypatch):
    monkeypatch.delenv(notebook.SWITCH, raising=False)
    monkeypatch.delenv(notebook.CHECKPOINT, raising=False)
    assert notebook.device() == "cpu" and not notebook.gpu_branch()
    assert notebook.stand_in("llama-3.1-8b") is ml.MODELS["llama-3.1-8b"] and notebook.tokens(128) == 128
    assert notebook.checkpoint() is None


@pytest.mark.parametrize("family", ["llama-3.1-8b", "llama-3.2-1b"])
def test_the_switch_takes_them_with_a_small_stand_in(family, monkeypatch):
    monkeypatch.setenv(notebook.SWITCH, "cpu")
    monkeypatch.delenv(notebook.CHECKPOINT, raising=False)
    real = ml.MODELS[family]
    assert notebook.device() == "cpu" and notebook.gpu_branch() and notebook.gpu_memory() == 0
    small = notebook.stand_in(family)
    assert ml.count_parameters(small).total < ml.count_parameters(real).total / 20
    keep = ("rope_scale_factor", "tie_embeddings", "use_scaled_rope", "rope_theta")
    assert all(getattr(small, k) == getattr(real, k) for k in keep)
    assert small.n_rep > 1 and "stand-in" in small.name and notebook.tokens(128) == 16
    state = torch.random.get_rng_state()
    path = notebook.checkpoint(family)
    assert torch.equal(torch.random.get_rng_state(), state)  # the notebook's random stream is untouched
    model = ml.load(path, progress=False)
    assert model.args.replace(name=small.name) == small.replace(vocab_size=real.vocab_size)  # the tokenizer's
    assert (model.output.weight is model.tok_embeddings.weight) == real.tie_embeddings


def test_a_checkpoint_in_the_environment_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(notebook.SWITCH, "cpu")
    monkeypatch.setenv(notebook.CHECKPOINT, str(tmp_path))
    assert notebook.checkpoint() == str(tmp_path)


def test_an_unknown_switch_value_is_an_error(monkeypatch):
    monkeypatch.setenv(notebook.SWITCH, "gpu")
    with pytest.raises(ValueError, match="MINILLAMA_GPU_BRANCHES='gpu'.*'cpu'"):
        notebook.gpu_branch()


def test_a_printed_table_is_text_and_html_with_the_same_cells():
    t = notebook.table(["model", "total", "share"], [["8B", "8,030,261,248", "6.542%"], ["405B", "1", "-0.5%"]])
    assert repr(t).splitlines() == [
        "model          total   share",
        "8B     8,030,261,248  6.542%",
        "405B               1   -0.5%",
    ]
    html = t._repr_html_()
    assert html.count("<tr>") == 3 and "<td style=\"text-align:right\">8,030,261,248</td>" in html
    assert "<td>8B</td>" in html  # a label column stays left-aligned
    with pytest.raises(ValueError, match="a row has 2 cells, the header 3"):
        notebook.table(["a", "b", "c"], [["1", "2"]])
