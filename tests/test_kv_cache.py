import torch

import minillama as ml


def test_cache_is_static_state_outside_the_state_dict():
    cache = ml.KVCache(2, 16, 2, 8)
    assert tuple(cache.k.shape) == (2, 2, 16, 8) and cache.state_dict() == {}
    k, v = torch.ones(2, 2, 3, 8), 2 * torch.ones(2, 2, 3, 8)
    keys, values = cache.update(torch.tensor([[4, 5, 6]]), k, v)
    written = keys.abs().sum(dim=(0, 1, 3)).nonzero().flatten().tolist()
    assert written == [4, 5, 6] and values[:, :, 4:7].eq(2).all()
    cache.reset()
    assert cache.k.abs().sum() == 0 and cache.v.abs().sum() == 0


def test_per_row_positions_write_their_own_rows():
    cache = ml.KVCache(3, 8, 1, 2)
    k = torch.arange(1.0, 4.0).view(3, 1, 1, 1).expand(3, 1, 1, 2)
    cache.update(torch.tensor([[0], [5], [7]]), k, k)
    assert [cache.k[i, 0].abs().sum(-1).nonzero().item() for i in range(3)] == [0, 5, 7]


def test_model_setup_cache_follows_device_and_dtype():
    model = ml.Transformer(ml.MODELS["tiny"].replace(vocab_size=64, n_layers=1)).to(torch.bfloat16)
    model.setup_cache(batch_size=2, max_seq_len=32)
    cache = model.layers[0].attention.cache
    assert cache.k.dtype == torch.bfloat16 and model.cache_shape == (2, 32)
    assert not any("cache" in k for k in model.state_dict())
    model.clear_cache()
    assert model.cache_shape is None


def test_shared_and_per_row_positions_write_the_same_cache():
    # positions [1, t] shared by every row take the copy path; [b, t] the per-row scatter
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 4, 8, generator=g), torch.randn(3, 2, 4, 8, generator=g)
    shared, per_row = ml.KVCache(3, 16, 2, 8), ml.KVCache(3, 16, 2, 8)
    keys, values = shared.update(torch.tensor([[5, 6, 7, 8]]), k, v)
    per_row.update(torch.tensor([[5, 6, 7, 8]]).expand(3, 4), k, v)
    assert torch.equal(shared.k, per_row.k) and torch.equal(shared.v, per_row.v)
    assert torch.equal(keys[:, :, 5:9], k) and torch.equal(values[:, :, 5:9], v)
    assert shared.k[:, :, :5].abs().sum() == 0 and shared.k[:, :, 9:].abs().sum() == 0
    half = ml.KVCache(3, 16, 2, 8)  # a smaller batch writes only its rows
    half.update(torch.tensor([[0]]), k[:2, :, :1], v[:2, :, :1])
    assert half.k[2].abs().sum() == 0 and torch.equal(half.k[:2, :, :1], k[:2, :, :1])
