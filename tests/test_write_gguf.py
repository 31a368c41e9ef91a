"""Writing GGUF files (`minillama/checkpoint/write_gguf.py`): what `save_gguf` writes reads back through
`ml.load` as an independent decoder (transformers' torch dequantisers) reads the file's bytes, every
weight within the rounding its ggml type allows (bounds from the formats' definitions, per block of 32),
under llama.cpp's names and shapes; the tokenizer and chat template of the source file come along; bad
input is refused in one line. With llama-cpp-python installed, llama.cpp runs a written file and computes
minillama's logits and greedy tokens."""

import numpy as np
import pytest
import torch
from conftest import random_model
from test_gguf import TINY, gguf_name, hf_dequantize, smol_path  # noqa: F401 (a fixture)

import minillama as ml
from minillama.checkpoint.write_gguf import GGUF_TYPES, save_gguf

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def f16_error(x: torch.Tensor) -> torch.Tensor:
    """How far float16 storage moves x."""
    return (x - x.half().float()).abs()


def bound(w: torch.Tensor, kind: str) -> torch.Tensor:
    """The largest error each weight of `w` [out, in] may carry in `kind`, from the format's definition."""
    if kind == "F16":
        return torch.maximum(w.abs() * 2**-11, torch.full_like(w, 2**-25))  # half an ulp (subnormals: 2^-25)
    if kind == "BF16":
        return w.abs() * 2**-8
    blocks = w.reshape(w.shape[0], -1, 32)  # rows split into blocks of 32
    lo, hi = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    amax = blocks.abs().amax(-1, keepdim=True)
    if kind == "Q8_0":  # codes -127..127 times d = amax / 127 (f16): half a step, plus the scale's rounding
        d = amax / 127
        per_block = d / 2 + 127 * f16_error(d)
    elif kind == "Q4_0":  # codes -8..7 times d = ±amax / 8: the far end (+8 d) is clamped to 7 d, one step
        d = amax / 8
        per_block = d + 8 * f16_error(d)
    else:  # Q4_1: codes 0..15 times d = (max - min) / 15 plus m = min, both f16
        d = (hi - lo) / 15
        per_block = d / 2 + 15 * f16_error(d) + f16_error(lo)
    return per_block.expand_as(blocks).reshape(w.shape) * (1 + 1e-6)  # float32 arithmetic of the bound


@pytest.mark.parametrize("kind", GGUF_TYPES)
def test_written_weights_read_back_within_their_types_rounding(tmp_path, kind):
    source = random_model(TINY)
    path = save_gguf(source, tmp_path / f"tiny-{kind}.gguf", kind)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    loaded = ml.load(path, dtype=torch.float32, progress=False)
    assert loaded.args.replace(name="x") == TINY.replace(name="x")
    state = loaded.state_dict()
    worst = 0.0
    for name, w in source.state_dict().items():
        t = tensors[gguf_name(name)]  # llama.cpp's name, its shape with the fastest axis first
        assert [int(n) for n in t.shape] == list(reversed(w.shape)), name
        stored = "F32" if w.dim() == 1 else kind
        assert t.tensor_type.name == stored, name
        if stored == "F32":
            assert torch.equal(state[name], w), name  # float32 is stored exactly
            continue
        independent = hf_dequantize(np.array(t.data), Q[stored], w.shape)
        assert torch.equal(state[name], independent), name
        error = (independent - w).abs()
        assert (error <= bound(w, stored)).all(), name
        worst = max(worst, float((error / bound(w, stored)).max()))
    if kind != "F32":  # the bounds are near what the rounding reaches (not vacuous)
        assert worst > 0.4, worst
    assert reader.fields["general.file_type"].contents() == {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7,
                                                             "Q4_0": 2, "Q4_1": 3}[kind]  # fmt: skip


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama31_scaling_and_a_tied_head_round_trip_exactly(tmp_path, tied):
    args = TINY.replace(rope_theta=500_000.0, use_scaled_rope=True, tie_embeddings=tied)
    source = random_model(args)
    if tied:
        source.output.weight = source.tok_embeddings.weight
    path = save_gguf(source, tmp_path / "l31.gguf")
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert ("output.weight" in names) != tied and "rope_freqs.weight" in names
    loaded = ml.load(path, progress=False)
    assert loaded.args.replace(name="x") == args.replace(name="x")
    assert (loaded.output.weight is loaded.tok_embeddings.weight) == tied
    x = torch.randint(0, args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def smol_shaped(vocab: int) -> ml.ModelArgs:
    """SmolLM2's vocabulary and attention shape, one narrow block: small enough for a test."""
    return ml.ModelArgs(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=vocab, hidden_dim=128,
                        max_seq_len=256, rope_theta=100_000.0, use_scaled_rope=False, tie_embeddings=True)  # fmt: skip


def test_the_tokenizer_and_chat_template_are_copied(tmp_path, smol_path):  # noqa: F811
    source_reader = gguf.GGUFReader(smol_path)
    vocab = len(source_reader.fields["tokenizer.ggml.tokens"].data)
    model = random_model(smol_shaped(vocab))
    model.output.weight = model.tok_embeddings.weight
    path = save_gguf(model, tmp_path / "smol-shaped.gguf", "Q8_0", tokenizer=smol_path)
    written = gguf.GGUFReader(path).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "general.name"):
        assert written[key].contents() == source_reader.fields[key].contents(), key
    text = "Write 12345 in words, please."
    assert ml.Tokenizer.default(path).encode(text) == ml.Tokenizer.default(smol_path).encode(text)


def test_bad_input_is_refused_in_one_line(tmp_path, smol_path):  # noqa: F811
    model = random_model(TINY)
    cases = [
        (lambda: save_gguf(model, tmp_path / "a.gguf", "Q4_K"), "unknown GGUF type 'Q4_K'"),
        (lambda: save_gguf(random_model(TINY.replace(dim=80, n_heads=4)), tmp_path / "b.gguf", "Q8_0"),
         "rows of 80 weights; Q8_0 stores blocks of 32"),
        (lambda: save_gguf(model, tmp_path / "c.gguf", tokenizer=smol_path), "49,152 tokens but the model's vocabulary is 256"),
        (lambda: save_gguf(ml.quantize(random_model(TINY), "int8"), tmp_path / "d.gguf"), "already quantised"),
    ]  # fmt: skip
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_llama_cpp_runs_a_written_file_as_minillama_does(tmp_path, smol_path):  # noqa: F811
    llama_cpp = pytest.importorskip(
        "llama_cpp",
        reason="llama-cpp-python is optional: pip install 'minillama[llamacpp]' (builds llama.cpp from source, "
        "about ten minutes on 2 cores)",
    )
    from minillama.bench.llamacpp import llama_cpp_greedy

    vocab = len(gguf.GGUFReader(smol_path).fields["tokenizer.ggml.tokens"].data)
    args = smol_shaped(vocab).replace(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, hidden_dim=256)
    model = random_model(args)
    model.output.weight = model.tok_embeddings.weight
    path = save_gguf(model, tmp_path / "f32.gguf", "F32", tokenizer=smol_path)
    prompt = ml.Tokenizer.default(smol_path).encode("The capital of France is")
    llm = llama_cpp.Llama(str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    llm.eval(prompt)
    theirs = torch.from_numpy(np.array(llm.scores[: len(prompt)]))
    with torch.no_grad():
        ours = model(torch.tensor([prompt]))[0]
    assert torch.allclose(theirs, ours, atol=1e-3 * float(ours.abs().max()), rtol=0)
    tokens, _ = llama_cpp_greedy(llm, prompt, 24)
    expected = ml.generate(model, [prompt], max_new_tokens=24, temperature=0.0)[0]
    assert tokens == expected
