"""Tensor parallelism (minillama.distributed, minillama.checkpoint.parallel) against the single process.
Checkpoints load per rank from Meta's shards, Hugging Face's safetensors and a GGUF file.

Two CPU ranks on gloo, bound to 127.0.0.1 and spawned by the test (`distributed.spawn`). Every rank
runs the same calls, so every collective is joined by both; the process group and `spawn` carry
timeouts, so a rank stuck in a collective fails the test instead of hanging it. The reference on each
rank is the same random model left whole.
"""

import json
import random

import pytest
import torch

import minillama as ml
from minillama.distributed import check_degree, checkpoint_demo, local_range, spawn
from minillama.model import random_model

WORLD = 2
TIMEOUT = 240  # seconds for the whole spawn (a hang fails here); a healthy run takes ~15-60 s


def _random_configs(n: int, seed: int = 0) -> list[ml.ModelArgs]:
    """Tiny configs whose n_kv_heads is divisible by 2, drawn with a seeded generator; vocabularies
    include odd sizes (the vocabulary-parallel embedding and head then split unevenly)."""
    rng = random.Random(seed)
    configs = []
    for _ in range(n):
        kv, g, hd = rng.choice([2, 4]), rng.choice([1, 2, 3]), rng.choice([8, 16])
        configs.append(
            ml.ModelArgs(
                dim=kv * g * hd,
                n_layers=2,
                n_heads=kv * g,
                n_kv_heads=kv,
                vocab_size=rng.randrange(200, 600),
                multiple_of=16,
                max_seq_len=64,
            )
        )
    return configs


CONFIGS = _random_configs(3)


def _compare(mesh, configs):
    """On each rank: the parallel model's outputs against the same model unsplit, per config."""
    results = []
    for i, args in enumerate(configs):
        gen = torch.Generator().manual_seed(i)
        tokens = torch.randint(0, args.vocab_size, (2, 9), generator=gen)
        outs = {}
        for name, model in (("single", random_model(args, seed=i)), ("tp", random_model(args, seed=i))):
            if name == "tp":
                ml.parallelize(model, mesh)
            o = outs[name] = {}
            with torch.inference_mode():
                o["full"] = model(tokens)
                model.setup_cache(2, 32)
                o["prefill"] = model(tokens[:, :6], start_pos=0)
                o["decode_int"] = model(tokens[:, 6:7], start_pos=6)
                o["decode_tensor"] = model(tokens[:, 7:8], start_pos=torch.tensor(7))
                o["decode_rows"] = model(tokens[:, 8:9], start_pos=torch.tensor([8, 8]))
            o["cache"] = tuple(model.layers[0].attention.cache.k.shape)
            o["greedy"] = ml.generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=6, temperature=0.0)
        errors = {
            k: (outs["tp"][k] - outs["single"][k]).abs().max().item()
            for k in outs["tp"]
            if "_" in k or k in ("full", "prefill")
        }
        results.append(
            {
                "errors": errors,
                "greedy": (outs["single"]["greedy"], outs["tp"]["greedy"]),
                "cache": (outs["single"]["cache"], outs["tp"]["cache"]),
                "scale": outs["single"]["full"].abs().max().item(),
            }
        )
    # a tied head (Llama 3.2 1B/3B): one matrix embeds and scores, and stays one after the split
    args = configs[0]
    tokens = torch.randint(0, args.vocab_size, (1, 5), generator=torch.Generator().manual_seed(9))
    pair = [random_model(args, seed=9), random_model(args, seed=9)]
    for m in pair:
        m.output.weight = m.tok_embeddings.weight
    ml.parallelize(pair[1], mesh)
    with torch.inference_mode():
        tied_error = (pair[1](tokens) - pair[0](tokens)).abs().max().item()
    still_tied = pair[1].output.weight is pair[1].tok_embeddings.weight
    try:  # n_kv_heads = 3 cannot be split over 2 ranks: every rank raises before any collective
        ml.parallelize(
            random_model(
                ml.ModelArgs(
                    dim=48, n_layers=1, n_heads=6, n_kv_heads=3, vocab_size=64, multiple_of=16, max_seq_len=16
                )
            ),
            mesh,
        )
        error = None
    except ValueError as e:
        error = str(e)
    return {
        "rank": mesh.get_local_rank(),
        "results": results,
        "degree_error": error,
        "tied": (tied_error, still_tied),
    }


def _rank_zero_alone(mesh):
    if mesh.get_local_rank() == 0:  # a collective that rank 1 never joins: a bug that would hang
        torch.distributed.all_reduce(torch.ones(1))
    return "done"


def test_a_collective_not_every_rank_joins_fails_instead_of_hanging():
    with pytest.raises((RuntimeError, TimeoutError)):
        spawn(_rank_zero_alone, WORLD, timeout=15)


def test_check_degree_names_the_limit():
    args = ml.MODELS["llama-3.1-70b"]
    for degree in (1, 2, 4, 8):
        check_degree(args, degree)
    with pytest.raises(ValueError, match=r"degree 16 does not divide n_kv_heads=8.*\[1, 2, 4, 8\]"):
        check_degree(args, 16)
    with pytest.raises(ValueError, match="degree 3"):
        check_degree(ml.MODELS["tiny"], 3)


def test_local_range_cuts_like_torch_chunk():
    for size in (8, 9, 257, 300):
        for degree in (1, 2, 3, 4):
            pieces = torch.arange(size).chunk(degree)
            got = [local_range(size, degree, r) for r in range(degree)]
            want = [(int(p[0]), len(p)) for p in pieces] + [(size, 0)] * (degree - len(pieces))
            assert got == want


# -- loading per rank -----------------------------------------------------------------------------

SEED = 3
DEMO_PROMPT = [5, 17, 42, 9]
META_ARGS = ml.ModelArgs(
    dim=64,
    n_layers=2,
    n_heads=8,
    n_kv_heads=4,
    vocab_size=256,
    multiple_of=32,
    max_seq_len=64,
    use_scaled_rope=True,
)
# how fairscale cuts Meta's shards (meta-llama/llama-models models/llama3/model.py): written out here,
# independently of the loader's own table
_FAIRSCALE_DIM = {
    "wq": 0,
    "wk": 0,
    "wv": 0,
    "w1": 0,
    "w3": 0,
    "output": 0,
    "tok_embeddings": 0,
    "wo": 1,
    "w2": 1,
}


def _write_meta(model: ml.Transformer, folder, shards: int) -> None:
    folder.mkdir()
    a = model.args
    params = {
        "dim": a.dim,
        "n_layers": a.n_layers,
        "n_heads": a.n_heads,
        "n_kv_heads": a.n_kv_heads,
        "vocab_size": a.vocab_size,
        "multiple_of": a.multiple_of,
        "ffn_dim_multiplier": a.ffn_dim_multiplier,
        "norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta,
        "use_scaled_rope": a.use_scaled_rope,
        "max_seq_len": a.max_seq_len,
    }
    (folder / "params.json").write_text(json.dumps(params))
    state = model.state_dict()
    for s in range(shards):
        shard = {}
        for name, w in state.items():
            dim = _FAIRSCALE_DIM.get(name.split(".")[-2])
            shard[name] = w.clone() if dim is None else w.chunk(shards, dim)[s].clone()
        torch.save(shard, folder / f"consolidated.{s:02d}.pth")


def _load_each(mesh, folders, seed):
    reference = random_model(META_ARGS, seed=seed)
    tokens = torch.randint(0, META_ARGS.vocab_size, (1, 7), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        want = reference(tokens)
    out = {}
    for label, folder in folders.items():
        model = ml.load(folder, mesh=mesh, dtype=torch.float32)  # each rank reads its own slices
        wq = model.layers[0].attention.wq.weight.to_local()
        with torch.inference_mode():
            err = (model(tokens) - want).abs().max().item()
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
        out[label] = {
            "error": err,
            "files": model.loaded_from,
            "wq_local": tuple(wq.shape),
            "bytes": 4 * local,
        }
    return out


def _both(mesh, configs, folders, seed):
    demo = checkpoint_demo(mesh, str(folders["hf"]), DEMO_PROMPT, 3)
    return _compare(mesh, configs), _load_each(mesh, folders, seed), demo


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """One spawn of two ranks runs every check (starting the processes is the slow part)."""
    tmp_path = tmp_path_factory.mktemp("checkpoints")
    model = random_model(META_ARGS, seed=SEED)
    folders = {}
    for shards in (1, 2, 4):
        folders[f"meta{shards}"] = tmp_path / f"meta{shards}"
        _write_meta(model, folders[f"meta{shards}"], shards)
    folders["hf"] = ml.save(model, tmp_path / "hf")
    # a GGUF file (float32 tensors, Llama 3.1's rope_freqs), written by the `gguf` package's writer
    from test_gguf import Q, encoded, llama31_divisors, write_gguf

    folders["gguf"] = write_gguf(
        tmp_path / "model.gguf", META_ARGS, encoded(model, Q.F32, tied=False), rope_freqs=llama31_divisors(META_ARGS)
    )
    return spawn(_both, WORLD, CONFIGS, folders, SEED, timeout=TIMEOUT)


def test_parallel_model_matches_single_process(ranks):
    assert [r["rank"] for r, *_ in ranks] == [0, 1]
    for r, *_ in ranks:
        for args, res in zip(CONFIGS, r["results"]):
            # row-parallel sums add the same products in another order: float32 rounding, no more
            for key, err in res["errors"].items():
                assert err <= 1e-5 * max(1.0, res["scale"]), (args, key, err)
            single, tp = res["greedy"]
            assert single == tp and len(single[0]) == 6
            # each rank's cache holds its own n_kv_heads / 2 heads
            b, kv, s, hd = res["cache"][0]
            assert res["cache"][1] == (b, args.n_kv_heads // WORLD, s, hd) and kv == args.n_kv_heads
        assert "does not divide n_kv_heads=3" in r["degree_error"]
        assert r["tied"][0] <= 1e-5 and r["tied"][1]


def test_sharded_checkpoints_load_per_rank(ranks):
    q_rows = META_ARGS.n_heads * META_ARGS.head_dim // WORLD
    for rank, (_, got, _) in enumerate(ranks):
        for label, res in got.items():
            assert res["error"] <= 1e-5, (label, res)
            assert res["wq_local"] == (q_rows, META_ARGS.dim)
            # what the accounting says a rank holds is what it holds
            assert res["bytes"] == ml.tensor_parallel_bytes(META_ARGS, WORLD, bytes_per_value=4).weights
        # degree == shards: rank r reads its own shard and nothing else
        assert got["meta2"]["files"] == [f"consolidated.{rank:02d}.pth"]
        # resharding: two source shards per rank from four, the one file from one
        assert got["meta4"]["files"] == [
            f"consolidated.{2 * rank:02d}.pth",
            f"consolidated.{2 * rank + 1:02d}.pth",
        ]
        assert got["meta1"]["files"] == ["consolidated.00.pth"]
        assert got["hf"]["files"] == ["model.safetensors"]
        assert got["gguf"]["files"] == ["model.gguf"]


def test_checkpoint_demo_matches_the_whole_model(ranks):
    """`checkpoint_demo` (chapter 11's trained-model run): each rank loads its slices of a saved checkpoint, and
    its logits and greedy tokens are the single-process model's."""
    model = random_model(META_ARGS, seed=SEED)
    with torch.inference_mode():
        want = model(torch.tensor([DEMO_PROMPT]))[0, -1]
    (greedy,) = ml.generate(model, [DEMO_PROMPT], max_new_tokens=3)
    for rank, (*_, demo) in enumerate(ranks):
        assert demo["rank"] == rank and len(demo["logits"]) == META_ARGS.vocab_size
        assert (torch.tensor(demo["logits"]) - want).abs().max().item() <= 1e-5
        assert demo["greedy"] == greedy
        assert demo["threads"] == 1  # spawn gives each rank one thread: N ranks share the cores
        assert demo["shapes"]["attention.wq.weight"] == (
            META_ARGS.n_heads * META_ARGS.head_dim // WORLD,
            META_ARGS.dim,
        )
