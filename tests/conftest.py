"""Shared fixtures: tiny random configs, and the two oracles nobody here wrote.

- Hugging Face `transformers` `LlamaForCausalLM` (rope_type "llama3"), weights copied from ours with
  the q/k rows permuted into HF's half-split rotary layout.
- Meta's reference `Transformer` from the `llama-models` package, with fairscale's model parallelism
  initialised at size 1 in this process (a one-rank gloo group).
"""

import socket

import pytest

# setuptools before anything else: a test that imports transformers' GGUF path pulls in the standard library's
# distutils, after which setuptools' shim refuses to load when Inductor later compiles a C++ kernel
# ("Distutils was imported before Setuptools"); importing setuptools first installs the shim.
import setuptools  # noqa: F401
import torch

import minillama as ml

# small configs that still exercise GQA groups, odd vocabularies and other rope bases
CONFIGS = {
    "gqa4": ml.ModelArgs(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=300, multiple_of=32, max_seq_len=256
    ),
    "mha": ml.ModelArgs(
        dim=48,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        vocab_size=257,
        multiple_of=16,
        ffn_dim_multiplier=None,
        rope_theta=10_000.0,
        max_seq_len=128,
    ),
    "mqa": ml.ModelArgs(
        dim=96,
        n_layers=3,
        n_heads=6,
        n_kv_heads=1,
        vocab_size=1000,
        multiple_of=64,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        max_seq_len=128,
    ),
    # Llama 3.2 1B and 3B shrunk (width, layers, vocabulary), keeping what sets them apart: the output head
    # tied to the embedding, RoPE scaled by 32, their GQA groups (4 and 3) and FFN multipliers
    "llama-3.2-1b-shrunk": ml.MODELS["llama-3.2-1b"].replace(
        dim=128, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=256
    ),
    "llama-3.2-3b-shrunk": ml.MODELS["llama-3.2-3b"].replace(
        dim=96, n_layers=3, n_heads=6, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=256
    ),
}


def random_model(args: ml.ModelArgs, seed: int = 0) -> ml.Transformer:
    """A model whose every weight (norm gains included) is a seeded random draw of sensible scale."""
    torch.manual_seed(seed)
    model = ml.Transformer(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.5 if "tok_embeddings" in name else args.dim**-0.5)
    return model.eval()


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved rotary pairs -> HF's half-split halves, per head (the permutation of
    transformers `models/llama/convert_llama_weights_to_hf.py`, written from its description)."""
    out_dim, in_dim = w.shape
    return w.view(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def to_hf(model: ml.Transformer):
    """The HF LlamaForCausalLM with our model's weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    a = model.args
    config = LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.dim,
        intermediate_size=a.ffn_hidden_dim,
        num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads,
        max_position_embeddings=a.max_seq_len,
        rms_norm_eps=a.norm_eps,
        tie_word_embeddings=a.tie_embeddings,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": a.rope_theta,
            "factor": a.rope_scale_factor,
            "low_freq_factor": a.rope_low_freq_factor,
            "high_freq_factor": a.rope_high_freq_factor,
            "original_max_position_embeddings": a.rope_original_max_seq_len,
        }
        if a.use_scaled_rope
        else {"rope_type": "default", "rope_theta": a.rope_theta},
        attn_implementation="eager",
    )
    hf = LlamaForCausalLM(config).eval()
    sd = model.state_dict()
    new = {
        "model.embed_tokens.weight": sd["tok_embeddings.weight"],
        "model.norm.weight": sd["norm.weight"],
        "lm_head.weight": sd["output.weight"],
    }
    names = {
        "attention.wq": "self_attn.q_proj",
        "attention.wk": "self_attn.k_proj",
        "attention.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for i in range(a.n_layers):
        for ours, theirs in names.items():
            w = sd[f"layers.{i}.{ours}.weight"]
            if ours == "attention.wq":
                w = hf_permute(w, a.n_heads)
            elif ours == "attention.wk":
                w = hf_permute(w, a.n_kv_heads)
            new[f"model.layers.{i}.{theirs}.weight"] = w
    hf.load_state_dict(new, strict=True)
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == a.tie_embeddings
    return hf


@pytest.fixture(scope="session")
def model_parallel():
    """fairscale model parallelism of size 1, which Meta's reference layers require."""
    import torch.distributed as dist
    from fairscale.nn.model_parallel import initialize as fs_init

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not fs_init.model_parallel_is_initialized():
        fs_init.initialize_model_parallel(1)
    yield


def to_meta_reference(model: ml.Transformer, max_batch_size: int = 4):
    """Meta's reference Transformer (llama-models) with our model's weights; names match as they are."""
    from llama_models.llama3.args import ModelArgs as MetaArgs
    from llama_models.llama3.model import Transformer as MetaTransformer

    a = model.args
    params = MetaArgs(
        dim=a.dim,
        n_layers=a.n_layers,
        n_heads=a.n_heads,
        n_kv_heads=a.n_kv_heads,
        vocab_size=a.vocab_size,
        multiple_of=a.multiple_of,
        ffn_dim_multiplier=a.ffn_dim_multiplier,
        norm_eps=a.norm_eps,
        rope_theta=a.rope_theta,
        use_scaled_rope=a.use_scaled_rope,
        max_batch_size=max_batch_size,
        max_seq_len=a.max_seq_len,
    )
    ref = MetaTransformer(params)
    ref.load_state_dict(model.state_dict(), strict=True)
    return ref.eval()


@pytest.fixture(scope="module")
def note():
    """`note(oracle, err)` records the worst relative error per oracle in a test module (and returns
    err); the module's worst figures are printed when it ends (`pytest -s` shows them)."""
    worst = {}

    def record(oracle: str, err: float) -> float:
        worst[oracle] = max(worst.get(oracle, 0.0), err)
        return err

    yield record
    print("\nworst relative error:", {k: f"{v:.2e}" for k, v in worst.items()})


def toc_files(entry) -> list[str]:
    """Every `file:` of a parsed _toc.yml, root first, then in reading order."""
    found = []
    if isinstance(entry, dict):
        for key in ("root", "file"):
            if key in entry:
                found.append(str(entry[key]))
        for key in ("parts", "chapters", "sections"):
            for child in entry.get(key) or []:
                found.extend(toc_files(child))
    return found


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest error relative to the largest magnitude of the reference."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
