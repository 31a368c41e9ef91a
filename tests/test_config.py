import pytest

import minillama as ml


def test_catalogue_matches_meta_sku_list():
    # the oracle: Meta's catalogue as shipped in llama-models (models/sku_list.py)
    from llama_models.sku_list import llama3_1_base_models

    meta = {}
    for (
        m
    ) in llama3_1_base_models():  # the first entry per repository (405B's mp16 variant duplicates KV heads)
        meta.setdefault(m.huggingface_repo.split("/")[-1].lower(), m.arch_args)
    for ours, theirs in [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("llama-3.1-70b", "llama-3.1-70b"),
        ("llama-3.1-405b", "llama-3.1-405b"),
    ]:
        args = ml.MODELS[ours]
        for field, value in meta[theirs].items():
            assert getattr(args, field) == value, (ours, field)


def test_derived_sizes_of_the_8b():
    args = ml.MODELS["llama-3.1-8b"]
    assert (args.head_dim, args.n_rep) == (128, 4)
    # 2/3 · 4 · 4096 = 10922, × 1.3 = 14198, rounded up to a multiple of 1024 = 14336
    assert args.ffn_hidden_dim == 14336
    assert ml.MODELS["llama-3.1-70b"].ffn_hidden_dim == 28672
    assert ml.MODELS["llama-3.1-405b"].ffn_hidden_dim == 53248
    assert args.replace(hidden_dim=1000).ffn_hidden_dim == 1000


def test_tiny_keeps_the_8b_structure():
    tiny = ml.MODELS["tiny"]
    assert tiny.n_rep == 4 and tiny.vocab_size == 128_256 and tiny.use_scaled_rope


def test_replace_copies_and_validates():
    args = ml.MODELS["llama-3.1-8b"]
    one = args.replace(n_layers=1)
    assert one.n_layers == 1 and args.n_layers == 32
    with pytest.raises(ValueError, match="dim=4096 is not divisible by n_heads=3"):
        args.replace(n_heads=3)
    with pytest.raises(ValueError, match="n_heads=32 is not divisible by n_kv_heads=5"):
        args.replace(n_kv_heads=5)
    with pytest.raises(ValueError, match="n_layers=0"):
        args.replace(n_layers=0)


@pytest.mark.parametrize(
    "typed, suggested",
    [
        ("llama-3.1-8B", "'llama-3.1-8b'"),  # case
        ("llama_3.2_1b", "'llama-3.2-1b'"),  # separators
        ("lama-3.1-8b", "'llama-3.1-8b'"),  # a typo
        ("llama-3.3-70", "'llama-3.3-70b'"),
    ],
)
def test_an_unknown_name_is_a_key_error_that_suggests_the_close_match(typed, suggested):
    with pytest.raises(KeyError) as error:
        ml.MODELS[typed]
    message = error.value.args[0]
    assert message.startswith(f"unknown model {typed!r}; did you mean {suggested}")
    assert message.endswith(f"valid models: {', '.join(ml.MODELS)}")


def test_a_name_far_from_every_model_lists_them_without_a_guess():
    with pytest.raises(KeyError) as error:
        ml.MODELS["gpt-5"]
    assert error.value.args[0] == f"unknown model 'gpt-5'; valid models: {', '.join(ml.MODELS)}"
    # the rest of the dict behaves as a dict
    assert ml.MODELS.get("gpt-5") is None and "gpt-5" not in ml.MODELS and "tiny" in ml.MODELS
    assert isinstance(ml.MODELS, dict) and list(ml.MODELS)[0] == "llama-3.1-8b"
