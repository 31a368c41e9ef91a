"""The cards: the seed's figures, first-principles figures for 70B and 405B, shapes against a real
forward pass, rendering in every mode, and errors that list what is valid.

Expected values are typed from the seed documents (shared/seeds/000_*.txt) or derived here from
the catalogue dimensions; none is computed by accounting.py or cards.py.
"""

import html.parser
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import minillama as ml
from minillama import cards
from minillama.cards import COMPONENTS, MODES, TENSORS, card, card_tabs, main_card, tensor_card

B8 = ml.MODELS["llama-3.1-8b"]
KiB, MiB, GiB = 2**10, 2**20, 2**30


@pytest.fixture(scope="module")
def seed_card():
    return card("attention", B8, mode="decode", positions=1000)


# the seed: Llama 3.1 8B, grouped-query attention, decode with P = 1,000


def test_seed_parameters(seed_card):
    p = seed_card.parameters
    assert [n for _, _, n in p.rows] == [16_777_216, 4_194_304, 4_194_304, 16_777_216]
    assert [c for c, _, _ in p.rows] == [
        "Query projection",
        "Key projection",
        "Value projection",
        "Output projection",
    ]
    assert [calc for _, calc, _ in p.rows] == [
        "4,096 × 4,096",
        "4,096 × (8 × 128)",
        "4,096 × (8 × 128)",
        "4,096 × 4,096",
    ]
    assert p.per_instance == 41_943_040 and p.instances == 32 and p.total == 1_342_177_280


def test_seed_numbers(seed_card):
    f = seed_card.facts
    assert f["keys_read"] == 1_001
    assert f["kv_bytes_per_token"] == 128 * KiB
    assert f["mha_kv_bytes_per_token"] == 512 * KiB
    assert round(f["kv_bytes_after_call"] / MiB, 1) == 125.1
    assert f["kv_bytes_full_context"] == 16 * GiB
    assert f["mha_kv_bytes_full_context"] == 64 * GiB


def test_seed_text(seed_card):
    text = str(seed_card)
    for line in [
        "Llama 3.1 8B · Grouped-query attention",
        "in:  x [B batch, 1 position, 4096 d]   R [1 position, 64 pairs]",
        "out: Δ_attn [B batch, 1 position, 4096 d]",
        "parameters: 41,943,040 × 32 blocks = 1,342,177,280",
        "mode: decode · P = 1,000 cached positions · L = P + 1 = 1,001 keys read",
        "state: KV cache: writes row 1,000, reads rows 0–1,000",
        "Across 32 independent blocks: 41,943,040 × 32 = 1,342,177,280 parameters.",
        "Llama 3.1 8B · 16-bit        128 KiB",
        "MHA (32 K/V heads) · 16-bit  512 KiB",
        "2 (K, V) × 32 layers × 8 heads × 128 × 2 bytes.",
        "After this call, at 1,001 positions: 125.1 MiB in use per sequence.",
        "At the full 131,072 tokens: 16 GiB per sequence (MHA: 64 GiB).",
        "Grouping cuts W_K, W_V and the cache 4×; the score and value products still run over 32 heads.",
    ]:
        assert line in text, line
    for value in ["16,777,216", "4,194,304", "41,943,040"]:
        assert value in text


def test_seed_sources(seed_card):
    keys = {s.key for s in seed_card.sources}
    assert {"config", "qkv", "rope", "gqa", "scores", "retrieval", "handoff"} <= keys
    assert "sku_list.py 19, 231–248" in {s.label for s in seed_card.sources}


def test_seed_markdown_and_html(seed_card):
    md = seed_card.markdown()
    assert r"$\Delta_{\mathrm{attn}}$ [B batch, 1 position, 4096 d]" in md
    assert (
        "| Component | Calculation | Parameters |" in md
        and "| Key projection | 4,096 × (8 × 128) | 4,194,304 |" in md
    )
    page = seed_card._repr_html_()
    assert "<table" in page and "1,342,177,280" in page and "Δ<sub>attn</sub>" in page


# 70B and 405B from first principles (dimensions from Meta's catalogue, sku_list.py 249–285)


@pytest.mark.parametrize(
    "key, dim, layers, heads, kv_heads",
    [("llama-3.1-70b", 8192, 80, 64, 8), ("llama-3.1-405b", 16384, 126, 128, 8)],
)
def test_large_models(key, dim, layers, heads, kv_heads):
    c = card("attention", ml.MODELS[key], mode="decode", positions=1000)
    head_dim = dim // heads  # 128 for both
    q = dim * (heads * head_dim)  # wq: d × (h · hd)
    k = dim * (kv_heads * head_dim)  # wk, wv: d × (kv · hd)
    per_block = q + k + k + q
    assert [n for _, _, n in c.parameters.rows] == [q, k, k, q]
    assert c.parameters.total == per_block * layers
    per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, every layer, 16-bit
    mha_per_token = 2 * layers * heads * head_dim * 2
    f = c.facts
    assert f["kv_bytes_per_token"] == per_token
    assert f["mha_kv_bytes_per_token"] == mha_per_token
    assert f["kv_bytes_after_call"] == per_token * 1001
    assert f["kv_bytes_full_context"] == per_token * 131_072
    assert f["mha_kv_bytes_full_context"] == mha_per_token * 131_072
    text = str(c)
    assert f"parameters: {per_block:,} × {layers} blocks = {per_block * layers:,}" in text
    assert f"{dim:,} × ({kv_heads} × {head_dim})" in text
    assert f"At the full 131,072 tokens: {per_token * 131_072 // GiB:,} GiB per sequence" in text
    assert f"still run over {heads} heads" in text and f"the cache {heads // kv_heads}×" in text


def test_large_model_numbers_as_printed():
    # 70B: 2·80·8·128·2 = 327,680 B = 320 KiB a token; 405B: 2·126·8·128·2 = 516,096 B = 504 KiB
    t70 = str(card("attention", ml.MODELS["llama-3.1-70b"], positions=1000))
    assert "320 KiB" in t70 and "2.5 MiB" in t70 and "312.8 MiB" in t70 and "(MHA: 320 GiB)" in t70
    t405 = str(card("attention", ml.MODELS["llama-3.1-405b"], positions=1000))
    assert "504 KiB" in t405 and "7.9 MiB" in t405 and "492.7 MiB" in t405 and "63 GiB" in t405
    assert "(MHA: 1,008 GiB)" in t405


def test_model_card_totals():
    # the published totals (shared/SOURCES.md)
    for key, total in [
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.2-3b", 3_212_749_824),
        ("llama-3.3-70b", 70_553_706_496),
    ]:
        assert card("model", ml.MODELS[key]).parameters.total == total


# prefill and full-sequence shapes


def test_prefill_shapes():
    c = card("attention", B8, mode="prefill", positions=512)
    assert c.inputs[0].text() == "x [B batch, 512 positions, 4096 d]"
    assert c.inputs[1].text().startswith("R [512 positions, 64 pairs]")
    assert c.state_line == "KV cache: writes rows 0–511, reads rows 0–511"
    assert c.facts["keys_read"] == 512
    assert tensor_card("xk", B8, mode="prefill", positions=512).tensor.shape("B") == ("B", 8, 512, 128)
    assert tensor_card("scores", B8, mode="prefill", positions=512).tensor.shape("B") == ("B", 32, 512, 512)
    assert tensor_card("cache_v", B8, mode="prefill", positions=512).tensor.shape("B") == ("B", 8, 512, 128)


def test_full_shapes():
    c = card("feed_forward", B8, mode="full", positions=1000)
    assert c.inputs[0].text() == "ĥ [B batch, 1,000 positions, 4096 d]"
    assert "no KV cache" in c.state_line
    # the seed's tensor card: K [B batch, 8 kv heads, T positions, 128 d_h], with the book's axis name hd
    xk = tensor_card("xk", B8, mode="full", positions=1000)
    assert xk.tensor.text() == "K [B batch, 8 kv heads, 1,000 positions, 128 hd]"
    assert tensor_card("probs", B8, mode="full", positions=7).tensor.shape(2) == (2, 32, 7, 7)
    assert tensor_card("ffn_hidden", B8, mode="full", positions=3).tensor.shape(1) == (1, 3, 14336)


def test_decode_shapes():
    assert tensor_card("xq", B8, positions=1000).tensor.shape("B") == ("B", 32, 1, 128)
    assert tensor_card("cache_k", B8, positions=1000).tensor.shape("B") == ("B", 8, 1001, 128)
    assert tensor_card("scores", B8, positions=1000).tensor.shape("B") == ("B", 32, 1, 1001)
    assert tensor_card("attn_out", B8, positions=1000).tensor.shape("B") == ("B", 1, 4096)
    assert card("output", B8, positions=1000).outputs[0].shape(3) == (3, 1, 128256)


# every tensor card against a real forward pass of the tiny model on the CPU


class _Kernel(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.qkv = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.qkv.append(args[:3])
        return func(*args, **(kwargs or {}))


def _real_shapes(args, mode, positions, batch):
    """Run the tiny model for real and record, with hooks, what each tensor card describes, in
    Meta's head-first layout (llama/model.py 156–160, 179–187)."""
    torch.manual_seed(0)
    model = ml.Transformer(args).eval()
    g, hd = args.n_rep, args.head_dim
    seen = {}
    block = model.layers[0]
    for name, module in {
        "wq": block.attention.wq,
        "wk": block.attention.wk,
        "wv": block.attention.wv,
    }.items():
        module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o))
    block.attention.wo.register_forward_pre_hook(lambda m, i: seen.__setitem__("wo_in", i[0]))
    block.feed_forward.w2.register_forward_pre_hook(lambda m, i: seen.__setitem__("w2_in", i[0]))
    block.register_forward_hook(lambda m, i, o: seen.__setitem__("block_out", o))
    generator = torch.Generator().manual_seed(1)
    if mode == "decode":
        model.setup_cache(batch, positions + 1)
        with torch.no_grad():
            model(torch.randint(0, args.vocab_size, (batch, positions), generator=generator), start_pos=0)
        tokens, start = torch.randint(0, args.vocab_size, (batch, 1), generator=generator), positions
    else:
        tokens = torch.randint(0, args.vocab_size, (batch, positions), generator=generator)
        start = 0 if mode == "prefill" else None
        if mode == "prefill":
            model.setup_cache(batch, positions)
    kernel = _Kernel()
    with torch.no_grad(), kernel:
        model(tokens, start_pos=start)
    q, k, v = kernel.qkv[0]  # layer 0: q [b, kv, (g t), hd], k, v [b, kv, s, hd]
    b, t = tokens.shape

    def heads(x):  # [b, t, (n hd)] -> [b, n, t, hd]
        return x.view(b, t, -1, hd).transpose(1, 2)

    scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).unflatten(2, (g, t)).flatten(1, 2)  # [b, h, t, s]
    if mode != "full":  # the keys read are the cache's first L rows
        L = k.shape[2]
        assert torch.equal(k, block.attention.cache.k[:b, :, :L])
    return {
        "xq": tuple(heads(seen["wq"]).shape),
        "xk": tuple(heads(seen["wk"]).shape),
        "xv": tuple(heads(seen["wv"]).shape),
        "cache_k": tuple(k.shape),
        "cache_v": tuple(v.shape),
        "scores": tuple(scores.shape),
        "probs": tuple(torch.softmax(scores, dim=-1).shape),
        "attn_out": tuple(seen["wo_in"].shape),
        "residual": tuple(seen["block_out"].shape),
        "ffn_hidden": tuple(seen["w2_in"].shape),
    }


@pytest.mark.parametrize("mode", MODES)
def test_tensor_cards_match_a_real_forward(mode):
    tiny = ml.MODELS["tiny"]
    positions, batch = 5, 2
    real = _real_shapes(tiny, mode, positions, batch)
    assert set(real) == set(TENSORS)
    for name in TENSORS:
        assert (
            tensor_card(name, tiny, mode=mode, positions=positions, batch=batch).tensor.shape(batch)
            == real[name]
        ), name
    # and with the symbolic batch, traced on the meta device with a stand-in
    for name in TENSORS:
        assert tensor_card(name, tiny, mode=mode, positions=positions).tensor.shape(batch) == real[name], name


def test_component_cards_match_a_real_forward():
    tiny = ml.MODELS["tiny"]
    torch.manual_seed(0)
    model = ml.Transformer(tiny).eval()
    seen = {}
    for name in (
        "tok_embeddings",
        "layers.0.attention_norm",
        "layers.0.attention",
        "layers.0.feed_forward",
        "norm",
        "output",
    ):
        model.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, (i[0].shape, o.shape))
        )
    tokens = torch.randint(0, tiny.vocab_size, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(tokens)
    pairs = {
        "embedding": "tok_embeddings",
        "attention_norm": "layers.0.attention_norm",
        "attention": "layers.0.attention",
        "feed_forward": "layers.0.feed_forward",
        "norm": "norm",
        "output": "output",
    }
    for name, module in pairs.items():
        c = card(name, tiny, mode="full", positions=6, batch=3)
        assert c.inputs[0].shape(3) == tuple(seen[module][0]), name
        assert c.outputs[0].shape(3) == tuple(seen[module][1]), name
    assert card("model", tiny, mode="full", positions=6, batch=3).outputs[0].shape(3) == tuple(logits.shape)


def test_a_wrong_shape_is_caught():
    c = card("attention", B8, mode="decode", positions=10)
    wrong = cards.NamedTensor(
        cards.SYMBOLS["x"],
        (cards.Axis("B", "batch"), cards.Axis(2, "positions"), cards.Axis(4096, "d")),
        traced="layers.0.attention:out",
    )
    c.outputs = [wrong]
    with pytest.raises(RuntimeError, match="disagree"):
        cards.trace.check_shapes(c, B8, 2)


# rendering


class _Balance(html.parser.HTMLParser):
    VOID = frozenset({"br", "input", "meta", "img", "hr"})

    def __init__(self):
        super().__init__()
        self.stack = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
        self.stack.pop()


def _well_formed(page: str):
    parser = _Balance()
    parser.feed(page)
    assert parser.stack == []
    # colours are inherited, never hard-coded: only translucent greys for borders
    assert not re.search(r"(?<![-\w])(color|background(-color)?)\s*:\s*(#|rgb\(|white|black)", page)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "tiny"])
@pytest.mark.parametrize("mode", MODES)
def test_every_card_renders(model, mode):
    args = ml.MODELS[model]
    for name in COMPONENTS:
        c = card(name, args, mode=mode, positions=9)
        assert c.title == f"{args.name} · {COMPONENTS[name]}"
        assert str(c) and c._repr_markdown_() == c.markdown()
        _well_formed(c._repr_html_())
        assert c.sources and all(s.url.startswith("https://github.com/") for s in c.sources)
    for name in TENSORS:
        c = tensor_card(name, args, mode=mode, positions=9, batch=4)
        assert "4 batch" in str(c) and c.markdown()
        _well_formed(c._repr_html_())


def test_tabs():
    tabs = card_tabs("attention", B8, positions=1000)
    assert list(tabs.cards) == list(MODES)
    page = tabs._repr_html_()
    _well_formed(page)
    assert page.count("type='radio'") == 3 and "<script" not in page
    assert ">Full sequence<" in page and ">Prefill<" in page and ">Decode<" in page
    assert re.search(r"id='[\w-]+-2' class='ml-tab-input' checked", page)  # decode open first
    assert "### Prefill" in tabs.markdown() and "== Decode ==" in str(tabs)
    assert card_tabs("xk", B8, positions=10).cards["full"].kind == "tensor"


def test_custom_config_cites_no_catalogue_entry():
    custom = ml.MODELS["tiny"].replace(n_layers=2, name="two-layer")
    c = card("attention", custom, positions=3)
    assert "sku_list.py" not in str(c) and "outside Meta's catalogue" in str(c)
    assert c.title == "two-layer · Grouped-query attention"


def test_bytes_format():
    fmt = cards.format_bytes
    assert fmt(128 * KiB) == "128 KiB" and fmt(16 * GiB) == "16 GiB" and fmt(1001 * 128 * KiB) == "125.1 MiB"
    assert fmt(512) == "512 B" and fmt(1536) == "1.5 KiB"


# errors


def test_errors_list_what_is_valid():
    with pytest.raises(ValueError, match="unknown card 'attn'.*attention.*kv_cache"):
        card("attn", B8)
    with pytest.raises(ValueError, match="unknown tensor 'keys'.*xq.*ffn_hidden"):
        tensor_card("keys", B8)
    with pytest.raises(ValueError, match="unknown mode 'train'; valid: full, prefill, decode"):
        card("attention", B8, mode="train")
    with pytest.raises(ValueError, match="max_seq_len=131072"):
        card("attention", B8, mode="decode", positions=131_072)
    with pytest.raises(ValueError, match="1 <= T"):
        card("attention", B8, mode="prefill", positions=0)
    with pytest.raises(ValueError, match="batch"):
        card("attention", B8, batch=0)
    with pytest.raises(TypeError, match="ModelArgs"):
        card("attention", "llama-3.1-8b")
    with pytest.raises(ValueError, match="components: .*tensors: "):
        card_tabs("nope", B8)


def test_cli(capsys):
    assert main_card(["attention", "--model", "llama-3.1-8b", "--mode", "decode", "--positions", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Llama 3.1 8B · Grouped-query attention" in out and "125.1 MiB" in out
    main_card(["xk", "--mode", "full", "--positions", "16", "--format", "markdown"])
    assert "$K$ [B batch, 8 kv heads, 16 positions, 128 hd]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main_card(["attention", "--mode", "train"])


# wording a cold read of the book found wrong (issue 14); each test fails if it comes back

NO_KV_COMPONENTS = ("embedding", "attention_norm", "ffn_norm", "norm", "rope", "feed_forward", "output")


@pytest.mark.parametrize("mode", MODES)
def test_no_kv_lines_on_cards_without_kv_state(mode):
    """A norm works on each position alone: its card names no keys read and no cache rows."""
    made = [card(name, B8, mode=mode, positions=1000) for name in NO_KV_COMPONENTS]
    made += [tensor_card(name, B8, mode=mode, positions=1000) for name in ("residual", "ffn_hidden")]
    for c in made:
        for page in (str(c), c.markdown(), c.html()):
            assert "keys read" not in page and "writes row" not in page and "reads rows" not in page, c.name
        assert c.state_line.startswith("no KV cache here"), c.name
    for name in ("attention", "kv_cache", "block", "model"):  # these do read the cache
        assert "keys read" in card(name, B8, mode=mode, positions=1000).mode_line, name
    if mode == "decode":
        assert made[1].mode_line == "decode · 1 new position, at position P = 1,000"


def test_parameters_line_has_no_stray_separator():
    for name in COMPONENTS:
        c = card(name, B8)
        for page in (str(c), c.markdown(), c.html()):
            assert "· ×" not in page, name
    assert card("attention_norm", B8).parameters_line == "4,096 × 32 blocks = 131,072"


def test_rope_card_divides_frequencies_and_lengthens_wavelengths():
    text = " ".join(card("rope", B8).numbers[0].text)
    # minillama's float32 cos and sin for 131,072 positions x 64 pairs; Meta's complex64 (8 bytes) for twice as many
    assert dict(card("rope", B8).numbers[0].rows) == {
        "minillama's cos, sin · 131,072 positions × 64 pairs · float32": "64 MiB",
        "Meta's complex64 table · 2 × 131,072 positions × 64 pairs": "128 MiB",
    }
    assert "are divided by" not in text
    assert (
        "29 with wavelengths over 8,192 have their frequencies divided by 8 (wavelengths 8× longer)" in text
    )
    # the count, from the module's tables: the pairs whose scaled frequency is the unscaled one / 8
    ratio = ml.inv_freq(B8.replace(use_scaled_rope=False)) / ml.inv_freq(B8)
    assert int(torch.isclose(ratio, torch.tensor(8.0, dtype=ratio.dtype)).sum()) == 29


@pytest.mark.parametrize("name", ["cache_k", "cache_v"])
def test_cache_tensor_cards_tell_prefill_from_decode(name):
    pre = tensor_card(name, B8, mode="prefill", positions=1000)
    dec = tensor_card(name, B8, mode="decode", positions=1000)
    assert pre.numbers[0].heading == dec.numbers[0].heading == "This call"
    assert dict(pre.numbers[0].rows) == {
        "New positions (queries)": "1,000",
        "Cache rows written": "rows 0–999",
        "Keys read, L": "1,000",
    }
    assert dict(dec.numbers[0].rows) == {
        "New positions (queries)": "1",
        "Cache rows written": "row 1,000",
        "Keys read, L": "1,001",
    }
    assert "rows 0–999 written by this call's 1,000 new positions" in pre.subtitle
    assert "row 1,000 written by this call's 1 new position" in dec.subtitle
    assert str(pre).replace(pre.mode_line, "") != str(dec).replace(dec.mode_line, "")
    full = tensor_card(name, B8, mode="full", positions=1000)
    assert [f.heading for f in full.numbers] == ["Size"]


@pytest.mark.parametrize("mode", MODES)
def test_head_width_is_named_hd(mode):
    """The book's axis name for the head width is hd (minillama/__init__.py), never d_h."""
    made = [card(name, B8, mode=mode, positions=9) for name in COMPONENTS]
    made += [tensor_card(name, B8, mode=mode, positions=9) for name in TENSORS]
    for c in made:
        for page in (str(c), c.markdown(), c.html()):
            assert "d_h" not in page, c.name
    assert tensor_card("xk", B8, mode=mode).tensor.axes[-1] == cards.Axis(128, "hd")


def test_model_card_decode_floor_excludes_the_embedding_table():
    c = card("model", B8, mode="decode", positions=1000)
    # from the catalogue dimensions: all weights but the 128,256 x 4,096 embedding, one embedding row,
    # and K, V of 32 layers x 8 heads x 128 at 1,001 positions, 16-bit each
    floor = (8_030_261_248 - 128_256 * 4096) * 2 + 4096 * 2 + 2 * 32 * 8 * 128 * 2 * 1001
    assert c.facts["decode_step_bytes"] == floor
    text = str(c)
    # the weights are held once per model, the cache and FLOPs per sequence, the floor per batch-1 step
    headings = [f.heading.split(" · ")[0] for f in c.numbers]
    assert headings == ["Per model", "Per sequence", "A decode step of one sequence"]
    assert dict(c.numbers[0].rows) == {"Weights · 16-bit": "15.0 GiB"}
    assert set(dict(c.numbers[1].rows)) == {"KV cache after this call · 16-bit", "FLOPs per new position"}
    assert dict(c.numbers[2].rows)["Bytes it reads at least · 16-bit"] == "14.1 GiB"
    # 2 FLOPs per matrix weight (all but the embedding and the 65 gains) + 4 h hd per key per layer
    flops = 2 * (8_030_261_248 - 128_256 * 4096 - 65 * 4096) + 4 * 32 * 32 * 128 * 1001
    assert dict(c.numbers[2].rows)["FLOPs per byte read · 16-bit"] == f"{flops / floor:.2f}" == "1.03"
    assert "except the embedding table (1,002 MiB), of which a sequence reads only its token's row" in text
    assert "reads every weight once and the cache" not in text
    assert "decode_step_bytes" not in card("model", B8, mode="prefill", positions=1000).facts


@pytest.mark.parametrize("key", ["llama-3.2-1b", "llama-3.2-3b"])
def test_cards_show_the_tied_head(key):
    a = ml.MODELS[key]
    head = card("output", a, mode="decode", positions=1000)
    assert head.parameters.total == 0  # counted once, in the embedding
    text = str(head)
    assert f"tied: the embedding's 128,256 × {a.dim:,}" in text and "shared with the embedding" in text
    assert "the tied head and RoPE factor 32 from the published Hugging Face config.json" in text
    assert "untied" not in text.lower()
    assert "same matrix (tied)" in str(card("embedding", a))
    whole = card("model", a, mode="decode", positions=1000)
    assert "an output head tied to it" in str(whole) and "untied" not in str(whole).lower()
    # the head reads the whole embedding matrix every step: the floor is every weight plus the cache
    kv = 2 * a.n_layers * a.n_kv_heads * a.head_dim * 2 * 1001
    assert whole.facts["decode_step_bytes"] == ml.count_parameters(a).total * 2 + kv
    assert [s.key for s in whole.sources if s.key.startswith("config")] == [f"config-{key[6:]}"]


def test_card_footnote_says_computed_and_converts_gib():
    # cold read (chapter 1): "checkpoint tensors are not counted" puzzled a reader who then saw the checkpoint
    # checked; chapter 11 works in GB while cards print GiB: the footnote gives the conversion
    note = card("model", B8, mode="decode", positions=1000).parameters.note
    assert "no checkpoint is loaded" in note and "checkpoint tensors" not in note
    gb = re.search(r"1 GiB = 2³⁰ bytes ≈ (\d\.\d{3}) GB", note)
    assert gb and float(gb.group(1)) == round(1024**3 / 10**9, 3)
