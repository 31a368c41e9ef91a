"""Checkpoints: Hugging Face and Meta files written by their own code load with their logits; `save`
round-trips and transformers reads what it writes; every bad checkpoint names what is wrong."""

import json
import shutil

import pytest
import torch
from conftest import random_model, rel_err
from safetensors.torch import load_file, save_file

import minillama as ml
from minillama.checkpoint import args_from_hf_config


def tokens_for(vocab: int, shape=(2, 37), seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------
# Hugging Face

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def hf_model(tie: bool = False, seed: int = 0):
    """A random transformers LlamaForCausalLM: GQA (8 query heads, 2 KV heads), Llama 3.1 rope scaling,
    an FFN width Meta's rounding rule would not give, every weight (norm gains too) random."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=131_072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_parameters=dict(LLAMA3_ROPE),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.5 if "embed" in name else 0.125)
    return model


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    hf = hf_model()
    path = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(path, max_shard_size="200KB")
    return hf, path


def test_hf_sharded_checkpoint_matches_transformers(hf_checkpoint, note):
    hf, path = hf_checkpoint
    assert (
        len(list(path.glob("model-*-of-*.safetensors"))) > 1
        and (path / "model.safetensors.index.json").is_file()
    )
    model = ml.load(path, progress=False)
    a = model.args
    assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab_size) == (64, 2, 8, 2, 320)
    assert a.ffn_hidden_dim == 176 and a.use_scaled_rope and a.rope_theta == 500_000.0
    tokens = tokens_for(320)
    with torch.no_grad():
        assert note("transformers, sharded HF load", rel_err(model(tokens), hf(tokens).logits)) < 1e-5


def test_hf_greedy_generation_matches_transformers(hf_checkpoint):
    hf, path = hf_checkpoint
    model = ml.load(path, progress=False)
    prompt = tokens_for(320, (1, 9), seed=3)
    n = 24
    hf.generation_config.eos_token_id = None  # no stop token on either side: n tokens each
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    ours = ml.generate(model, [prompt[0].tolist()], max_new_tokens=n, stop_tokens=())
    assert ours[0] == theirs[0, prompt.shape[1] :].tolist()
    assert len(ours[0]) == n


def published_8b_config() -> dict:
    """meta-llama/Llama-3.1-8B's config.json as published (transformers 4.x keys; the values listed in
    shared/SOURCES.md)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    }


def test_published_8b_config_reads_as_the_catalogue_8b():
    assert args_from_hf_config(published_8b_config()) == ml.MODELS["llama-3.1-8b"]


def to_4x_keys(config: dict) -> dict:
    """A transformers 5.x config.json rewritten with 4.x keys: rope_theta on top, scaling in rope_scaling."""
    config = dict(config)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    return config


def test_transformers_4x_and_5x_configs_give_the_same_model(hf_checkpoint, tmp_path):
    hf, path = hf_checkpoint
    config = json.loads((path / "config.json").read_text())
    assert "rope_parameters" in config  # transformers 5.x wrote it
    shutil.copytree(path, tmp_path / "old", dirs_exist_ok=True)
    (tmp_path / "old" / "config.json").write_text(json.dumps(to_4x_keys(config)))
    assert ml.load_args(tmp_path / "old") == ml.load_args(path)
    tokens = tokens_for(320)
    with torch.no_grad():
        assert rel_err(ml.load(tmp_path / "old", progress=False)(tokens), hf(tokens).logits) < 1e-5


def test_tied_embeddings_share_one_matrix(tmp_path):
    hf = hf_model(tie=True)
    hf.save_pretrained(tmp_path)
    model = ml.load(tmp_path, progress=False)
    assert model.output.weight is model.tok_embeddings.weight
    tokens = tokens_for(320)
    with torch.no_grad():
        assert rel_err(model(tokens), hf(tokens).logits) < 1e-5
    ml.save(model, tmp_path / "again")  # written once, with tie_word_embeddings true
    assert json.loads((tmp_path / "again" / "config.json").read_text())["tie_word_embeddings"] is True
    assert ml.load(tmp_path / "again", progress=False).output.weight is not None


def test_dtype_and_progress_bar(hf_checkpoint, capsys):
    hf, path = hf_checkpoint
    model = ml.load(path, dtype=torch.bfloat16, progress=True)
    assert "loading tensors" in capsys.readouterr().err
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rope.cos.dtype == torch.float32 and model.rope.cos.device.type == "cpu"
    tokens = tokens_for(320)
    with torch.no_grad():
        assert rel_err(model(tokens), hf(tokens).logits) < 0.05


# ---------------------------------------------------------------------------------------------------------
# Meta

META_PARAMS = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 8,
    "n_kv_heads": 2,
    "vocab_size": 300,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.3,
    "norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
}


@pytest.fixture(scope="module")
def meta_reference(model_parallel):
    """Meta's reference Transformer (llama-models 0.3.0) with seeded random weights of its own."""
    from llama_models.llama3.args import ModelArgs as MetaArgs
    from llama_models.llama3.model import Transformer as MetaTransformer

    torch.manual_seed(0)
    ref = MetaTransformer(MetaArgs(**META_PARAMS, max_batch_size=2, max_seq_len=64))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.5 if "tok_embeddings" in name else 0.125)
    return ref.eval()


def write_meta(path, shards: list[dict], params: dict = META_PARAMS):
    path.mkdir(parents=True, exist_ok=True)
    (path / "params.json").write_text(json.dumps(params))
    for i, shard in enumerate(shards):
        torch.save(shard, path / f"consolidated.{i:02d}.pth")
    return path


@pytest.fixture(scope="module")
def meta_checkpoint(meta_reference, tmp_path_factory):
    state = {k: v.clone() for k, v in meta_reference.state_dict().items()}
    return write_meta(tmp_path_factory.mktemp("meta"), [state])


def meta_logits(ref, tokens):
    return ref(tokens, start_pos=0)


def test_meta_checkpoint_matches_reference(meta_reference, meta_checkpoint, note):
    model = ml.load(meta_checkpoint, progress=False)
    assert model.args.ffn_hidden_dim == meta_reference.layers[0].feed_forward.w1.weight.shape[0]
    assert model.args.max_seq_len == 131_072  # Llama 3.1 (scaled RoPE) when params.json does not say
    tokens = tokens_for(300)
    assert (
        note(
            "Meta reference, consolidated.00.pth", rel_err(model(tokens), meta_logits(meta_reference, tokens))
        )
        < 1e-5
    )


def test_meta_two_shards_written_by_metas_resharder(meta_reference, tmp_path, note):
    """Shards cut by llama-models' own `reshard_mp` (model parallel 1 -> 2) load to the same logits."""
    from llama_models.checkpoint import reshard_mp

    state = meta_reference.state_dict()
    shards = [reshard_mp([state], size=2, rank=r) for r in range(2)]
    assert shards[0]["layers.0.attention.wo.weight"].shape == (64, 32)  # really split
    assert shards[0]["tok_embeddings.weight"].shape == (150, 64)
    model = ml.load(write_meta(tmp_path, shards), progress=False)
    tokens = tokens_for(300)
    assert (
        note("Meta reference, 2 shards", rel_err(model(tokens), meta_logits(meta_reference, tokens))) < 1e-5
    )


def test_meta_shards_with_llama2_style_embedding_split(meta_reference, tmp_path):
    """Llama 2's ParallelEmbedding split tok_embeddings along the width (dim 1)."""
    from llama_models.checkpoint import reshard_mp

    state = meta_reference.state_dict()
    shards = [reshard_mp([state], size=2, rank=r) for r in range(2)]
    for r in range(2):
        shards[r]["tok_embeddings.weight"] = state["tok_embeddings.weight"].chunk(2, dim=1)[r].clone()
    model = ml.load(write_meta(tmp_path, shards), progress=False)
    tokens = tokens_for(300)
    assert rel_err(model(tokens), meta_logits(meta_reference, tokens)) < 1e-5


def test_meta_files_under_original(meta_reference, meta_checkpoint, tmp_path):
    """A Hugging Face repository download with only Meta's files (under original/) loads those."""
    shutil.copytree(meta_checkpoint, tmp_path / "original")
    (tmp_path / "README.md").write_text("model card")
    model = ml.load(tmp_path, progress=False)
    tokens = tokens_for(300)
    assert rel_err(model(tokens), meta_logits(meta_reference, tokens)) < 1e-5


def test_hf_layout_preferred_over_original(hf_checkpoint, meta_checkpoint, tmp_path):
    _hf, path = hf_checkpoint
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    shutil.copytree(meta_checkpoint, tmp_path / "original")
    assert ml.load_args(tmp_path).vocab_size == 320  # the HF model, not the Meta one (300)


# ---------------------------------------------------------------------------------------------------------
# save


def test_save_round_trip_and_transformers_reads_it(tmp_path, note):
    from transformers import LlamaForCausalLM

    args = ml.ModelArgs(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=300, multiple_of=32, max_seq_len=256
    )
    model = random_model(args)
    ml.save(model, tmp_path, max_shard_bytes=100_000)
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    back = ml.load(tmp_path, progress=False)
    assert back.args == args
    for name, w in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], w), name
    hf = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    tokens = tokens_for(300)
    with torch.no_grad():
        assert note("transformers reads ml.save", rel_err(model(tokens), hf(tokens).logits)) < 1e-5
    ml.save(back, tmp_path)  # overwriting: one file now, the old shards gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_meta_round_trip_through_save(meta_reference, meta_checkpoint, tmp_path):
    model = ml.load(meta_checkpoint, progress=False)
    ml.save(model, tmp_path)
    back = ml.load(tmp_path, progress=False)
    assert back.args == model.args
    tokens = tokens_for(300)
    assert rel_err(back(tokens), meta_logits(meta_reference, tokens)) < 1e-5


# ---------------------------------------------------------------------------------------------------------
# errors name the problem


def test_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist: .*nowhere"):
        ml.load(tmp_path / "nowhere")


def test_cuda_without_a_gpu_is_a_clear_error_before_any_progress_bar(tmp_path, capsys, monkeypatch):
    model = random_model(ml.ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16))
    ml.save(model, tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    for device in ("cuda", "cuda:1", torch.device("cuda")):
        with pytest.raises(ValueError, match=r"device='cuda(:1)?' but CUDA is not available here") as error:
            ml.load(tmp_path, device=device)
        assert "device='cpu'" in str(error.value)
    assert capsys.readouterr().err == ""  # no progress bar was started
    assert ml.load(tmp_path, device="cpu", progress=False).args == model.args


def test_unknown_layout_lists_the_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"not a checkpoint.*notes\.txt, pytorch_model\.bin.*\.bin weights are not read"
    ):
        ml.load(tmp_path)


def rewrite_hf(src, dst, change):
    """Copy an HF checkpoint, applying change(name, tensor) -> {name: tensor} to every tensor."""
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for file in sorted(set(index["weight_map"].values())):
        tensors = {}
        for name, w in load_file(dst / file).items():
            tensors.update(change(name, w))
        save_file(tensors, dst / file, metadata={"format": "pt"})
    return dst


def test_missing_tensor_is_named(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint
    gone = "model.layers.1.mlp.up_proj.weight"
    bad = rewrite_hf(path, tmp_path / "bad", lambda n, w: {} if n == gone else {n: w})
    with pytest.raises(ValueError, match=rf"missing tensor '{gone}'"):
        ml.load(bad, progress=False)


def test_unexpected_tensor_is_named(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint
    extra = "model.layers.0.self_attn.q_norm.weight"
    bad = rewrite_hf(
        path, tmp_path / "bad", lambda n, w: {n: w, extra: torch.ones(8)} if "embed" in n else {n: w}
    )
    with pytest.raises(ValueError, match=rf"unexpected tensor .*'{extra}'"):
        ml.load(bad, progress=False)


def test_unexpected_tensor_meta(meta_reference, tmp_path):
    state = dict(meta_reference.state_dict())
    state["layers.0.attention.bias"] = torch.zeros(64)
    with pytest.raises(ValueError, match=r"unexpected tensor .*'layers\.0\.attention\.bias'"):
        ml.load(write_meta(tmp_path, [state]), progress=False)


def test_shape_mismatch_names_tensor_and_both_shapes(meta_reference, tmp_path):
    state = dict(meta_reference.state_dict())
    state["layers.1.attention.wk.weight"] = torch.zeros(32, 64)
    with pytest.raises(
        ValueError,
        match=r"shape mismatch for 'layers\.1\.attention\.wk\.weight'.*expected \(16, 64\).*found \(32, 64\)",
    ):
        ml.load(write_meta(tmp_path, [state]), progress=False)


def test_config_and_weights_disagree_on_layers(meta_reference, tmp_path):
    state = dict(meta_reference.state_dict())
    with pytest.raises(ValueError, match=r"n_layers=1 but the weights hold layers 0\.\.1"):
        ml.load(write_meta(tmp_path, [state], {**META_PARAMS, "n_layers": 1}), progress=False)


def test_config_and_weights_disagree_on_vocab(meta_reference, tmp_path):
    state = dict(meta_reference.state_dict())
    with pytest.raises(
        ValueError, match=r"shape mismatch for 'tok_embeddings\.weight'.*vocab_size=256.*found \(300, 64\)"
    ):
        ml.load(write_meta(tmp_path, [state], {**META_PARAMS, "vocab_size": 256}), progress=False)


def test_unsupported_dtypes(meta_reference, tmp_path):
    state = dict(meta_reference.state_dict())
    state["norm.weight"] = state["norm.weight"].to(torch.int8)
    with pytest.raises(ValueError, match=r"unsupported dtype torch\.int8 for .*'norm\.weight'"):
        ml.load(write_meta(tmp_path, [state]), progress=False)
    with pytest.raises(ValueError, match=r"unsupported dtype 'int8'"):
        ml.load(tmp_path, dtype="int8")


def test_shard_listed_in_index_but_absent(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint
    shutil.copytree(path, tmp_path / "bad")
    victim = max((tmp_path / "bad").glob("model-*-of-*.safetensors"))
    victim.unlink()
    with pytest.raises(
        FileNotFoundError, match=rf"{victim.name} is listed in model\.safetensors\.index\.json"
    ):
        ml.load(tmp_path / "bad")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
            "rope_type 'yarn' is not supported",
        ),
        ({"model_type": "mistral"}, "model_type is 'mistral'"),
        ({"head_dim": 32}, "head_dim=32 differs"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
    ],
)
def test_unsupported_hf_configs(hf_checkpoint, change, message):
    _, path = hf_checkpoint
    config = {**json.loads((path / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=message):
        args_from_hf_config(config)


# ---------------------------------------------------------------------------------------------------------
# tied heads: Llama 3.2 1B and 3B

# Meta's params.json of the two (the arch_args of llama-models 0.3.0 `sku_list.py` 329-362): no word of
# the tie or of the RoPE factor 32
LLAMA_3_2_PARAMS = {
    "llama-3.2-1b": {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.5},
    "llama-3.2-3b": {"dim": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8, "ffn_dim_multiplier": 1.0},
}
COMMON_3_2 = {"vocab_size": 128256, "multiple_of": 256, "norm_eps": 1e-5, "rope_theta": 500000.0}


@pytest.mark.parametrize("name", LLAMA_3_2_PARAMS)
def test_llama_3_2_params_json_reads_as_the_catalogue_entry(name):
    from llama_models.sku_list import resolve_model

    params = {**LLAMA_3_2_PARAMS[name], **COMMON_3_2, "use_scaled_rope": True}
    meta = resolve_model(name.replace("llama-", "Llama").replace("-1b", "-1B").replace("-3b", "-3B"))
    assert {k: meta.arch_args[k] for k in params} == params  # the same numbers as Meta's catalogue
    args = ml.checkpoint.args_from_meta_params(params)
    assert args == ml.MODELS[name]
    assert args.tie_embeddings and args.rope_scale_factor == 32.0


@pytest.mark.parametrize("name", LLAMA_3_2_PARAMS)
def test_llama_3_2_hf_config_reads_as_the_catalogue_entry(name):
    args = ml.MODELS[name]
    config = ml.checkpoint.hf_config(args)
    del config["minillama"]  # as published: no minillama keys
    assert config["tie_word_embeddings"] is True and config["rope_scaling"]["factor"] == 32.0
    assert config["intermediate_size"] == 8192
    assert args_from_hf_config(config) == args


def tied_meta_checkpoint(path, model, head=None):
    a = model.args
    params = {k: getattr(a, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size")}
    params |= {
        k: getattr(a, k)
        for k in ("multiple_of", "ffn_dim_multiplier", "norm_eps", "rope_theta", "max_seq_len")
    }
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "output.weight"}
    if head is not None:
        state["output.weight"] = head
    return write_meta(path, [state], {**params, "use_scaled_rope": True})


def test_meta_checkpoint_of_a_tied_model(monkeypatch, tmp_path, note):
    """A Meta checkpoint of a catalogue shape that ties its head, with the head stored or not."""
    from conftest import CONFIGS, to_hf

    args = CONFIGS["llama-3.2-1b-shrunk"]
    monkeypatch.setitem(ml.MODELS, "shrunk-1b", args)  # the catalogue is what says "tied" for Meta's files
    model = random_model(args)
    hf = to_hf(model)
    tokens = tokens_for(args.vocab_size)
    embedding = model.tok_embeddings.weight.detach()
    for stored in (None, embedding.clone()):
        path = tied_meta_checkpoint(tmp_path / f"head-{stored is not None}", model, stored)
        loaded = ml.load(path, progress=False)
        assert loaded.args == args and loaded.output.weight is loaded.tok_embeddings.weight
        with torch.no_grad():
            assert note("transformers, tied, Meta layout", rel_err(loaded(tokens), hf(tokens).logits)) < 1e-5
    path = tied_meta_checkpoint(tmp_path / "other-head", model, embedding + 1)
    with pytest.raises(ValueError, match="ties the output head.*differs from tok_embeddings"):
        ml.load(path, progress=False)


@pytest.mark.parametrize("name", ["llama-3.2-1b-shrunk", "llama-3.2-3b-shrunk"])
def test_save_round_trips_a_tied_model(name, tmp_path, note):
    from conftest import CONFIGS
    from transformers import LlamaForCausalLM

    model = random_model(CONFIGS[name])
    ml.save(model, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in stored and "model.embed_tokens.weight" in stored  # written once
    back = ml.load(tmp_path, progress=False)
    assert back.args == model.args and back.output.weight is back.tok_embeddings.weight
    for key, w in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], w), key
    hf = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    tokens = tokens_for(model.args.vocab_size)
    with torch.no_grad():
        assert note("transformers reads a tied ml.save", rel_err(model(tokens), hf(tokens).logits)) < 1e-5
