"""minillama.serving: the paged cache, the block manager, the scheduler and the engine (chapter 12).

The test of the whole thing: under greedy decoding every request gets the tokens `ml.generate` gives
it alone, whatever else shares its steps (staggered arrivals, chunked prefill, preemption, shared
prefixes, int8 weights); and no block leaks (the `engine` fixture checks every engine a test built).
"""

import pytest
import torch
from conftest import CONFIGS, random_model

import minillama as ml
from minillama.serving import BlockManager, PagedKVCache, PagedView, SamplingParams


@pytest.fixture(scope="module")
def model():
    return random_model(CONFIGS["gqa4"], seed=0)


@pytest.fixture
def engine():
    """Build engines with `engine(model, **kw)`; after the test each one must be idle with every block free."""
    built = []

    def make(net, **kw):
        built.append(ml.Engine(net, **kw))
        return built[-1]

    yield make
    for e in built:
        assert not e.has_unfinished()
        assert e.free_blocks == e.num_blocks, f"{e.num_blocks - e.free_blocks} blocks leaked"


def prompts_of(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def alone(net, prompts, max_new_tokens, **kw):
    """Each prompt through ml.generate on its own: the reference."""
    return [ml.generate(net, [p], max_new_tokens=max_new_tokens, **kw)[0] for p in prompts]


def run_staggered(e, prompts, params, arrivals):
    """Add prompt i before step arrivals[i]; step until everything finished; each request's tokens."""
    out, ids, step = {}, {}, 0
    while len(ids) < len(prompts) or e.has_unfinished():
        for i, p in enumerate(prompts):
            if arrivals[i] == step:
                ids[e.add_request(p, params)] = i
                out[i] = []
        for o in e.step():
            if o.token is not None:
                out[ids[o.request_id]].append(o.token)
        step += 1
    return [out[i] for i in range(len(prompts))]


# ----------------------------------------------------------------------------------------------------
# the pieces


def test_paged_cache_writes_slots_and_gathers_tables_in_order():
    cache = PagedKVCache(num_blocks=6, block_size=2, n_kv_heads=1, head_dim=1)
    # row 0 holds positions 0..2 in blocks [4, 1]; row 1 position 0..1 in block [3]
    k = torch.tensor([[10.0, 11.0, 12.0], [20.0, 21.0, 0.0]])[:, None, :, None]  # [b, kv, t, hd]
    view = PagedView(
        positions=torch.tensor([[0, 1, 2], [0, 1, 0]]),
        slots=torch.tensor([[8, 9, 2], [6, 7, -1]]),  # block 4 -> slots 8, 9; block 1 -> 2; block 3 -> 6, 7
        block_tables=torch.tensor([[4, 1], [3, 0]]),
        block_size=2,
        mask=torch.ones(2, 3, 4, dtype=torch.bool),
        pads=True,
    )
    keys, values = cache.update(view, k, -k)
    assert cache.k[:, :, 0, 0].tolist() == [[0, 0], [12, 0], [0, 0], [20, 21], [10, 11], [0, 0]]
    assert keys[0, 0, :3, 0].tolist() == [10, 11, 12] and keys[1, 0, :2, 0].tolist() == [20, 21]
    assert torch.equal(values, -keys) and keys.shape == (2, 1, 4, 1)


def test_block_manager_shares_full_blocks_by_prefix_and_counts_references():
    bm = BlockManager(num_blocks=8, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    table = [bm.take() for _ in range(3)]
    blocks = list(table)  # release() empties the table it is given
    assert bm.seal(table, tokens, computed=5, sealed=0) == 2  # blocks [1, 2], [3, 4] full; [5] is not
    same = bm.match_prefix([1, 2, 3, 4, 9, 9])
    assert same == table[:2] and bm.refs[table[0]] == 2 and bm.num_free == 5
    assert bm.match_prefix([9, 2, 3, 4, 5]) == []  # the first block differs
    assert bm.match_prefix([3, 4, 1, 2, 5]) == []  # [3, 4] cached, but after another prefix
    assert bm.match_prefix([1, 2, 3, 4]) == table[:1]  # the last token must be computed: never its block
    bm.release(same)
    bm.release([table[0]])
    bm.release(table)
    assert bm.num_free == 8 and bm.refs == [0] * 8 and table == []
    # freed blocks keep their prefix until handed out again
    again = bm.match_prefix(tokens)
    assert again == blocks[:2] and bm.num_free == 6
    bm.release(again)


def test_sampling_params_reject_bad_values():
    for kw, word in [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
                     ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k")]:  # fmt: skip
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kw)


# ----------------------------------------------------------------------------------------------------
# the engine: greedy identity


@pytest.mark.parametrize("name", ["gqa4", "mqa", "llama-3.2-1b-shrunk"])
def test_greedy_tokens_equal_generate_alone_under_staggered_arrivals(name, engine):
    net = random_model(CONFIGS[name], seed=1)
    prompts = prompts_of([5, 23, 1, 40, 9, 17, 31], net.args.vocab_size, seed=2)
    ref = alone(net, prompts, 10)
    e = engine(net, block_size=4, max_batch=4, max_tokens_per_step=24, num_blocks=64)
    e.trace = []
    got = run_staggered(e, prompts, SamplingParams(max_tokens=10), arrivals=[0, 0, 2, 3, 3, 7, 12])
    assert got == ref
    fed = [sum(n for _, _, n in step["rows"]) for step in e.trace]
    assert max(fed) <= 24 and max(len(step["rows"]) for step in e.trace) <= 4
    assert any(n < 23 and start > 0 for step in e.trace for _, start, n in step["rows"] if n > 1)  # chunked


def test_long_prompt_is_chunked_without_stalling_the_decoders(model, engine):
    prompts = prompts_of([6, 7, 120], model.args.vocab_size, seed=3)
    e = engine(model, block_size=8, max_tokens_per_step=16, num_blocks=64)
    e.trace = []
    got = run_staggered(e, prompts, SamplingParams(max_tokens=12), arrivals=[0, 0, 3])
    assert got == alone(model, prompts, 12)
    # while the long prompt prefills in chunks, both short requests still get a token every step
    chunks = [step for step in e.trace if any(rid == 2 and n > 1 for rid, _, n in step["rows"])]
    assert len(chunks) >= 120 // 16
    for step in chunks[:5]:
        assert {rid for rid, _, n in step["rows"] if n == 1} == {0, 1}


def test_a_pool_too_small_for_all_preempts_the_youngest_and_recomputes(model, engine):
    prompts = prompts_of([20, 13, 30, 8, 25, 17], model.args.vocab_size, seed=4)
    ref = alone(model, prompts, 16)
    # 6 requests need 6 x 3 blocks of 16 at the end; the pool holds 8: some must wait or be preempted
    e = engine(model, block_size=16, num_blocks=8, max_batch=6, max_tokens_per_step=64, prefix_sharing=False)
    got = e.generate(prompts, SamplingParams(max_tokens=16))
    assert got == ref
    assert e.stats()["preemptions"] > 0


def test_shared_prefix_skips_exactly_the_shared_full_blocks(model, engine):
    system = prompts_of([37], model.args.vocab_size, seed=5)[0]  # 37 tokens: 4 full blocks of 8, 5 over
    prompts = [system + p for p in prompts_of([3, 9, 14, 6], model.args.vocab_size, seed=6)]
    ref = alone(model, prompts, 8)
    e = engine(model, block_size=8, num_blocks=64)
    first = e.generate(prompts[:1], SamplingParams(max_tokens=8))
    rest = e.generate(prompts[1:], SamplingParams(max_tokens=8))
    assert first + rest == ref
    stats = e.stats()
    assert stats["prefill_tokens_saved"] == 3 * 4 * 8
    prompt_tokens = sum(len(p) for p in prompts)
    assert stats["computed_tokens"] == prompt_tokens - 3 * 32 + 4 * (
        8 - 1
    )  # decode feeds all but the last token

    plain = engine(model, block_size=8, num_blocks=64, prefix_sharing=False)
    assert plain.generate(prompts, SamplingParams(max_tokens=8)) == ref
    assert plain.stats()["prefill_tokens_saved"] == 0


def test_requests_sharing_a_prefix_in_the_same_batch(model, engine):
    system = prompts_of([40], model.args.vocab_size, seed=7)[0]
    prompts = [system + p for p in prompts_of([2, 5, 11], model.args.vocab_size, seed=8)]
    e = engine(model, block_size=8, num_blocks=40, max_tokens_per_step=32)
    e.trace = []
    got = run_staggered(e, prompts, SamplingParams(max_tokens=6), arrivals=[0, 1, 3])
    assert got == alone(model, prompts, 6)
    assert e.stats()["prefill_tokens_saved"] > 0


def test_int8_quantised_model(engine):
    net = ml.quantize(random_model(CONFIGS["gqa4"], seed=9), "int8")
    prompts = prompts_of([11, 4, 27, 19], net.args.vocab_size, seed=10)
    e = engine(net, block_size=4, num_blocks=24, max_batch=3, max_tokens_per_step=16)
    got = run_staggered(e, prompts, SamplingParams(max_tokens=9), arrivals=[0, 1, 1, 5])
    assert got == alone(net, prompts, 9)


def test_generate_on_the_same_model_between_steps_keeps_its_own_cache(model, engine):
    prompts = prompts_of([9, 14], model.args.vocab_size, seed=11)
    ref = alone(model, prompts, 6)
    e = engine(model, block_size=4, num_blocks=16)
    rid = e.add_request(prompts[0], SamplingParams(max_tokens=6))
    tokens = []
    while e.has_unfinished():
        tokens += [o.token for o in e.step() if o.request_id == rid and o.token is not None]
        assert ml.generate(model, [prompts[1]], max_new_tokens=6)[0] == ref[1]
    assert tokens == ref[0]


# ----------------------------------------------------------------------------------------------------
# stops, sampling, aborts, errors


def test_stop_tokens_end_a_request_as_generate_does(model, engine):
    prompts = prompts_of([7, 12, 3], model.args.vocab_size, seed=12)
    full = alone(model, prompts, 12)
    stop = full[1][4]  # a token request 1 produces: it stops there, the others wherever it occurs
    ref = alone(model, prompts, 12, stop_tokens=[stop])
    e = engine(model, block_size=4, num_blocks=32)
    ids = [e.add_request(p, SamplingParams(max_tokens=12, stop_tokens=(stop,))) for p in prompts]
    outs = []
    while e.has_unfinished():
        outs += e.step()
    got = [[o.token for o in outs if o.request_id == rid and o.token is not None] for rid in ids]
    assert got == ref and len(got[1]) == full[1].index(stop)
    last = {o.request_id: o for o in outs if o.finished}
    assert last[ids[1]].finish_reason == "stop" and last[ids[1]].token is None
    assert {last[rid].finish_reason for rid in ids} <= {"stop", "length"}


def test_sampled_requests_follow_their_own_seed_whatever_the_batch(model, engine):
    prompts = prompts_of([8, 15, 4], model.args.vocab_size, seed=13)
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_k=50, seed=s) for s in (1, 2, 3)]
    one = engine(model, block_size=4, num_blocks=32)
    apart = [one.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
    both = engine(model, block_size=4, num_blocks=32, max_tokens_per_step=8)
    ids = [both.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    outs = []
    while both.has_unfinished():
        outs += both.step()
    together = [[o.token for o in outs if o.request_id == rid] for rid in ids]
    assert together == apart
    # and the same draws as ml.generate for a single prompt with the same seed
    assert (
        apart[0] == ml.generate(model, [prompts[0]], max_new_tokens=10, temperature=0.9, top_k=50, seed=1)[0]
    )
    assert len({tuple(t) for t in apart}) == 3


def test_abort_frees_the_blocks_at_once(model, engine):
    e = engine(model, block_size=4, num_blocks=32)
    a = e.add_request(prompts_of([30], model.args.vocab_size)[0], SamplingParams(max_tokens=20))
    b = e.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    e.step()
    used = e.num_blocks - e.free_blocks
    assert used >= 30 // 4
    e.abort(a)
    assert e.num_blocks - e.free_blocks < used - 30 // 4 + 1
    e.abort(a)  # twice: a no-op
    e.abort(12345)  # unknown: a no-op
    outs = []
    while e.has_unfinished():
        outs += e.step()
    assert [(o.token, o.finish_reason) for o in outs if o.request_id == a] == [(None, "abort")]
    assert sum(o.token is not None for o in outs if o.request_id == b) == 3 - 1  # one came in the first step


@pytest.mark.parametrize(
    ("prompt", "kw", "message"),
    [
        (list(range(250)), {"max_tokens": 7}, "max_seq_len=256"),
        (list(range(30)), {"max_tokens": 40}, "num_blocks=4"),
        ([], {}, "empty"),
        ([1, 300], {}, "0..299"),
        ("text", {}, "tokenizer"),
    ],
)
def test_bad_requests_raise_naming_the_limit(model, engine, prompt, kw, message):
    e = engine(model, block_size=16, num_blocks=4)
    with pytest.raises(ValueError, match=message):
        e.add_request(prompt, SamplingParams(**kw))
    assert not e.has_unfinished()


def test_bad_engine_arguments(model):
    for kw, word in [({"block_size": 0}, "block_size"), ({"max_batch": 0}, "max_batch"),
                     ({"max_tokens_per_step": 0}, "max_tokens_per_step"), ({"num_blocks": 0}, "num_blocks")]:  # fmt: skip
        with pytest.raises(ValueError, match=word):
            ml.Engine(model, **kw)


def test_default_pool_is_a_memory_budget(model, engine):
    e = engine(model)
    per_sequence = -(-model.args.max_seq_len // e.block_size)
    assert per_sequence <= e.num_blocks <= 32 * per_sequence
    assert e.stats()["kv_bytes_allocated"] <= max(256 * 2**20, per_sequence * e.runner.bytes_per_block)


def test_logits_at_several_positions_per_row(model):
    tokens = torch.tensor(prompts_of([7, 7], model.args.vocab_size, seed=14))
    full = model(tokens)
    some = model(tokens, logits_at=torch.tensor([[1, 6], [0, 3]]))
    assert torch.allclose(some[0], full[0, [1, 6]], atol=1e-5) and torch.allclose(
        some[1], full[1, [0, 3]], atol=1e-5
    )


def test_serving_bench_replays_one_workload_on_static_and_engine(model):
    from minillama.bench import serving as sb

    work = sb.poisson_workload(5, rate=50.0, prompt_lens=(4, 12), output_lens=(2, 6), vocab=300, seed=3)
    again = sb.poisson_workload(5, rate=50.0, prompt_lens=(4, 12), output_lens=(2, 6), vocab=300, seed=3)
    assert work == again and work[0].arrival == 0 and all(4 <= len(r.prompt) <= 12 for r in work)
    shared = sb.poisson_workload(5, 50.0, (4, 12), (2, 6), vocab=300, seed=3, shared_prefix=7)
    assert [r.prompt[7:] for r in shared] == [r.prompt for r in work]  # the same requests behind a prefix
    static, memory = sb.run_static(model, work, max_batch=2)
    served, stats = sb.run_engine(model, work, max_batch=2, block_size=4, num_blocks=16)
    assert [s.tokens for s in served] == [s.tokens for s in static]
    assert [len(s.tokens) for s in served] == [r.max_tokens for r in work]
    assert 0 < memory["kv_bytes_used"] <= memory["kv_bytes_allocated"]
    assert 0 < stats["kv_bytes_peak_used"] <= stats["kv_bytes_peak_allocated"]
    summary = sb.summarize(served)
    assert summary["output_tokens"] == sum(r.max_tokens for r in work) and summary["tokens_per_s"] > 0
    assert all(s.times[0] >= s.arrival and s.times == sorted(s.times) for s in served)


def test_serving_budget_sweep_runs_the_same_requests_at_each_budget(model):
    from minillama.bench import serving as sb

    kw = {"n": 4, "rate": 50.0, "prompt_lens": (10, 20), "output_lens": (2, 4), "shared_prefix": 8}
    run = sb.budget_sweep(model, (4, 64), max_batch=2, block_size=4, log=lambda s: None, **kw)
    work = sb.poisson_workload(4, 50.0, (10, 20), (2, 4), model.args.vocab_size, 0)
    for name in ("mixed", "shared"):
        small, large = run[name]["4"], run[name]["64"]
        assert small["output_tokens"] == large["output_tokens"] == sum(r.max_tokens for r in work)
        # a budget of 4 cuts every prompt into chunks: more steps than with the whole prompts at once
        assert small["steps"] > large["steps"]
