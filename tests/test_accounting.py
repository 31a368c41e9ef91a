import pytest
import torch

import minillama as ml

PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    # Llama 3.2: the totals of the published safetensors (Hugging Face meta-llama/Llama-3.2-1B and -3B),
    # the tied head counted once; Llama 3.3 70B has the 3.1 70B's shape
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_totals_match_published_and_the_module(name):
    args = ml.MODELS[name]
    count = ml.count_parameters(args)
    assert count.total == PUBLISHED[name]
    with torch.device("meta"):
        model = ml.Transformer(args)
    block = model.layers[0]
    assert count.attention == sum(p.numel() for p in block.attention.parameters())
    assert count.feed_forward == sum(p.numel() for p in block.feed_forward.parameters())
    assert count.norms == block.attention_norm.weight.numel() + block.ffn_norm.weight.numel()
    assert count.embedding == model.tok_embeddings.weight.numel()
    assert count.output == (0 if args.tie_embeddings else model.output.weight.numel())
    assert (model.output.weight is model.tok_embeddings.weight) == args.tie_embeddings
    assert count.total == sum(p.numel() for p in model.parameters())
    assert count.table()[-1] == ("Total", "", count.total)
    assert sum(row[2] for row in count.table()[:-1]) == count.total


def test_8b_per_block_attention_is_the_seed_figure():
    # the seed card: 16,777,216 + 4,194,304 + 4,194,304 + 16,777,216 per block
    assert ml.count_parameters(ml.MODELS["llama-3.1-8b"]).attention == 41_943_040


def test_kv_cache_bytes():
    args = ml.MODELS["llama-3.1-8b"]
    assert ml.kv_cache_bytes(args, positions=1) == 128 * 1024  # 2 · 32 · 8 · 128 · 2 bytes
    assert ml.kv_cache_bytes(args, positions=131_072) == 16 * 1024**3
    mha = args.replace(n_kv_heads=32)
    assert ml.kv_cache_bytes(mha, positions=1) == 4 * ml.kv_cache_bytes(args, positions=1)
    assert ml.kv_cache_bytes(args, positions=1001, batch=3, bytes_per_value=4) == 3 * 2 * 1001 * 128 * 1024


def test_weight_and_step_bytes():
    args = ml.MODELS["llama-3.1-8b"]
    assert ml.weight_bytes(args, 2) == 2 * PUBLISHED["llama-3.1-8b"]
    assert ml.weight_bytes(args, 0.5) == PUBLISHED["llama-3.1-8b"] // 2
    step = ml.decode_step_bytes(args, context=0, batch=1, bytes_per_value=2)
    assert step == 2 * (PUBLISHED["llama-3.1-8b"] - 128_256 * 4096 + 4096)


def test_flops_per_token():
    args = ml.MODELS["llama-3.1-8b"]
    matmul_weights = PUBLISHED["llama-3.1-8b"] - 128_256 * 4096 - (2 * 32 + 1) * 4096
    assert ml.flops_per_token(args, context=0) == 2 * matmul_weights
    assert ml.flops_per_token(args, 1000) - ml.flops_per_token(args, 0) == 32 * 4 * 32 * 128 * 1000


def test_a_tied_head_is_stored_once_but_read_and_multiplied_in_full():
    tied, untied = ml.MODELS["llama-3.2-1b"], ml.MODELS["llama-3.2-1b"].replace(tie_embeddings=False)
    head = tied.dim * tied.vocab_size  # 2,048 x 128,256
    assert ml.count_parameters(untied).total - ml.count_parameters(tied).total == head
    assert ml.weight_bytes(untied) - ml.weight_bytes(tied) == 2 * head
    # a decode step reads the head either way; untied it also reads one embedding row
    assert ml.decode_step_bytes(untied, 100) - ml.decode_step_bytes(tied, 100) == 2 * tied.dim
    assert ml.flops_per_token(untied, 100) == ml.flops_per_token(tied, 100)
