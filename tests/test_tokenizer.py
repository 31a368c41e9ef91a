"""minillama.tokenizer against Meta's reference tokenizer and chat format (llama-models 0.3.0)."""

import random
import re
import shutil
import sys
import time

import pytest
import torch

from minillama import tokenizer as tokenizer_module
from minillama.tokenizer import StreamDecoder, Tokenizer

llama_tokenizer = pytest.importorskip("llama_models.llama3.tokenizer")
chat_format = pytest.importorskip("llama_models.llama3.chat_format")
from llama_models.datatypes import RawMessage  # noqa: E402  (after the skip guard)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.default()


@pytest.fixture(scope="module")
def meta():
    return llama_tokenizer.Tokenizer.get_instance()


SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they'd said.",
    "contractions_upper": "I'M SURE IT'S FINE, YOU'VE SEEN IT, WE'LL GO, SHE'D KNOW, THEY'RE HERE",
    "code": (
        "def f(x: int) -> dict[str, int]:\n"
        "    if x <= 0:\n\treturn {'a': x ** 2}  # comment\n"
        "    return {k: v for k, v in zip('abc', range(3))}\n\n\n"
        '#include <stdio.h>\nint main(){printf("%d\\n", 42);}\r\n'
    ),
    "numbers": "1 12 123 1234 12345 3.14159 -0.5e-10 1,000,000 0x1F 2024-07-23 ١٢٣ ४५६",
    "whitespace_mix": "a  b   c\t\td\n\ne \r\n f\u00a0g\u3000h\u2003i\x0b\x0cj   \n  \n\t\n",
    "only_whitespace": "   \t \n \n\n    ",
    "newlines": "\n" * 7 + "x" + "\r\n" * 5 + "y\n",
    "chinese": "大型语言模型是一种人工智能程序，能够识别和生成文本。我们今天去公园散步吧！",
    "japanese": "東京は日本の首都です。ひらがなとカタカナ、そして漢字。",
    "korean": "안녕하세요, 세계! 언어 모델은 재미있습니다.",
    "arabic": "اللغة العربية هي لغة سامية، يتحدث بها أكثر من ٤٠٠ مليون شخص.",
    "hindi": "हिन्दी भारत की एक आधिकारिक भाषा है। नमस्ते दुनिया!",
    "russian": "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка!",
    "greek_hebrew_thai": "Καλημέρα κόσμε · שלום עולם · สวัสดีชาวโลก",
    "emoji": "I ❤️ 🦙s! 👍🏽 🇯🇵 🏳️‍🌈 👩‍👩‍👧‍👦 👨🏿‍💻 🧑‍🚀 ✨🔥💯",
    "combining": "e\u0301 n\u0303 a\u0308\u0304 Z\u0337\u0334\u0321a\u0336l\u0338g\u0335o",
    "special_lookalikes": "<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n<|python_tag|>",
    "special_fragments": "<| |> <|eot_id <|reserved_special_token_300|> <|EOT_ID|> <<|eot_id|>>",
    "urls_markup": "https://example.com/a?b=c&d=e#f <a href='x'>y</a> **bold** `code` $x^2$",
    "empty": "",
}


def random_mixed_text(rng: random.Random, length: int) -> str:
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 8 + "\t\n\r\u00a0\u3000\u2009",
        ".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黑",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗ",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौंः्",
        "😀😂🥲🦙🚀🌍🎉👍🏽👩‍💻🇯🇵❤️‍🔥\u200d\ufe0f",
        "<|>_",
    ]
    weights = [20, 4, 10, 5, 8, 6, 5, 5, 3, 2]
    return "".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(length))


RANDOM_TEXTS = [
    random_mixed_text(random.Random(seed), random.Random(1000 + seed).randint(1, 400)) for seed in range(300)
]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_encode_matches_meta(tok, meta, name):
    text = SAMPLES[name]
    assert tok.encode(text) == meta.encode(text, bos=False, eos=False)
    assert tok.encode(text, bos=True, eos=True) == meta.encode(text, bos=True, eos=True)


def test_encode_matches_meta_on_random_mixed_script_text(tok, meta):
    n_tokens = 0
    for text in RANDOM_TEXTS:
        ours = tok.encode(text)
        assert ours == meta.encode(text, bos=False, eos=False), text
        n_tokens += len(ours)
    assert n_tokens > 20_000  # the comparison covered a real amount of text


def test_round_trip(tok):
    for text in [*SAMPLES.values(), *RANDOM_TEXTS]:
        assert tok.decode(tok.encode(text)) == text


def test_bos_eos_placement(tok):
    body = tok.encode("Hello world")
    assert tok.encode("Hello world", bos=True) == [128000, *body]
    assert tok.encode("Hello world", eos=True) == [*body, 128001]
    assert tok.encode("Hello world", bos=True, eos=True) == [128000, *body, 128001]
    assert tok.encode("", bos=True, eos=True) == [128000, 128001]
    assert tok.encode("") == []


def test_special_token_text_is_plain_text(tok, meta):
    text = "".join(tok.special_tokens) + SAMPLES["special_lookalikes"] + SAMPLES["special_fragments"]
    ours = tok.encode(text)
    assert ours == meta.encode(text, bos=False, eos=False, disallowed_special=())
    assert max(ours) < 128_000  # no special id came out of text
    assert tok.decode(ours) == text
    # what we deliberately do not do: Meta with allowed_special="all" turns the text into special ids
    assert meta.encode("<|eot_id|>", bos=False, eos=False, allowed_special="all") == [128009]
    assert tok.encode("<|eot_id|>") == meta.encode("<|eot_id|>", bos=False, eos=False) != [128009]


def test_special_tokens_match_meta(tok, meta):
    assert tok.special_tokens == meta.special_tokens
    assert len(tok.special_tokens) == 256
    assert sorted(tok.special_tokens.values()) == list(range(128_000, 128_256))
    assert tok.n_words == tok.vocab_size == meta.n_words == 128_256
    assert (tok.bos_id, tok.eos_id, tok.eot_id, tok.eom_id, tok.pad_id, tok.python_tag_id) == (
        meta.bos_id,
        meta.eos_id,
        meta.eot_id,
        meta.eom_id,
        meta.pad_id,
        meta.python_tag_id,
    )
    assert set(tok.stop_tokens) == set(meta.stop_tokens)
    # the ids the issue and the chat format name, stated independently of both implementations
    expected = {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|reserved_special_token_0|>": 128002,
        "<|finetune_right_pad_id|>": 128004,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
    }
    assert {name: tok.special_tokens[name] for name in expected} == expected
    assert set(tok.stop_tokens) == {128001, 128008, 128009}
    ids = list(range(128_000, 128_256))
    assert tok.decode(ids) == meta.decode(ids) == "".join(tok.special_tokens)
    assert all(tok.is_special(i) for i in ids) and not tok.is_special(127_999)


# --- very long inputs: Meta cuts them before tiktoken; the cuts change the tokens, so they must match


def _meta_pieces(text):
    step = llama_tokenizer.TIKTOKEN_MAX_ENCODE_CHARS
    for start in range(0, len(text), step):
        yield from llama_tokenizer.Tokenizer._split_whitespaces_or_nonwhitespaces(
            text[start : start + step], llama_tokenizer.MAX_NO_WHITESPACES_CHARS
        )


LONG_TEXTS = {
    "spaces_30k": " " * 30_000,
    "spaces_exactly_25k": "x" + " " * 25_000 + "y",
    "spaces_25k_plus_1": "x" + " " * 25_001 + "y",
    "spaces_100k_in_text": "start " + " " * 100_000 + "end",
    "letters_60k": "a" * 60_001,
    "newlines_tabs_40k": "line\n" + "\n\t" * 20_000 + "end",
    "digits_30k": "7" * 30_000,
    "cjk_30k": "语" * 30_000,
    "unicode_spaces_30k": "\u3000\u00a0\u2003" * 10_000,
}


@pytest.mark.parametrize("name", list(LONG_TEXTS))
def test_long_runs_match_meta(tok, meta, name):
    text = LONG_TEXTS[name]
    assert list(tokenizer_module._tiktoken_pieces(text)) == list(_meta_pieces(text))
    ours = tok.encode(text)
    assert ours == meta.encode(text, bos=False, eos=False)
    assert tok.decode(ours) == text


def test_long_whitespace_cut_changes_tokens(tok, meta):
    # the case is not vacuous: tiktoken on the uncut text gives other tokens than Meta's cut text
    text = " " * 100_000
    assert tok._bpe.encode_ordinary(text) != meta.encode(text, bos=False, eos=False) == tok.encode(text)


def test_text_longer_than_one_tiktoken_window_matches_meta(tok, meta):
    rng = random.Random(7)
    words = [random_mixed_text(rng, rng.randint(1, 12)) for _ in range(2_000)]
    text = " ".join(rng.choice(words) for _ in range(120_000))  # ~ 900k characters, 3 windows
    text = text[:399_990] + "a" * 20 + " " * 30_000 + text[399_990:]  # a word across the 400k cut
    assert len(text) > 2 * 400_000
    assert list(tokenizer_module._tiktoken_pieces(text)) == list(_meta_pieces(text))
    ours = tok.encode(text)
    assert ours == meta.encode(text, bos=False, eos=False)
    assert len(ours) > 100_000


def test_every_unicode_whitespace_is_cut_like_meta(tok, meta):
    # our cuts use the regex class \s, Meta's use str.isspace: they must agree on every code point
    everything = "".join(map(chr, range(0x110000)))
    spaces = [c for c in everything if c.isspace()]
    assert set(re.findall(r"\s", everything)) == set(spaces)
    text = "".join(c * 25_001 + "ab" for c in spaces)
    assert list(tokenizer_module._tiktoken_pieces(text)) == list(_meta_pieces(text))
    assert tok.encode(text) == meta.encode(text, bos=False, eos=False)


def test_runs_just_under_the_limit_stay_fast(tok, meta):
    # many runs of exactly 25,000: nothing to cut, and finding that must stay linear in the length
    # (a run pattern without the lookbehinds rescans each run from every position: ~30 s here)
    text = ("x" + " " * 25_000) * 16 + ("y" * 25_000 + " ") * 16
    start = time.perf_counter()
    pieces = list(tokenizer_module._tiktoken_pieces(text))
    assert time.perf_counter() - start < 3.0
    assert pieces == list(_meta_pieces(text))
    assert tok.encode(text) == meta.encode(text, bos=False, eos=False)


# --- decode


def test_decode_accepts_lists_tuples_and_tensors(tok, meta):
    ids = tok.encode(SAMPLES["emoji"] + SAMPLES["chinese"], bos=True)
    expected = meta.decode(ids)
    assert tok.decode(ids) == tok.decode(tuple(ids)) == tok.decode(torch.tensor(ids)) == expected
    assert tok.decode(torch.tensor(ids).numpy()) == expected
    assert tok.decode([]) == ""


def test_decode_rejects_bad_ids(tok):
    with pytest.raises(ValueError, match="128256.*0..128255"):
        tok.decode([1, 128_256])
    with pytest.raises(ValueError, match="-1"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="1-d"):
        tok.decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="1.5"):
        tok.decode([1.5])
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")


# --- streaming


def test_stream_decoder_reproduces_decode_without_replacement_chars(tok):
    text = "".join(
        SAMPLES[k] for k in ("emoji", "chinese", "hindi", "arabic", "russian", "combining", "korean")
    )
    text += "".join(RANDOM_TEXTS[:50])
    ids = tok.encode(text, bos=True, eos=True)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tok.decode(ids) == "<|begin_of_text|>" + text + "<|end_of_text|>"
    assert not any("\ufffd" in piece for piece in pieces)
    # not vacuous: some tokens ended inside a character, and decoding them alone gives U+FFFD
    held = [i for i, piece in zip(ids, pieces) if piece == ""]
    assert held and all("\ufffd" in tok.decode([i]) for i in held[:20])


def test_stream_decoder_on_random_ids_equals_decode(tok):
    # random ids make invalid UTF-8: the stream must still agree with decode's U+FFFD placement
    for seed in range(20):
        rng = random.Random(seed)
        ids = [rng.randrange(tok.n_words) for _ in range(rng.randint(1, 300))]
        stream = StreamDecoder(tok)
        streamed = "".join(stream.push(torch.tensor(i)) for i in ids) + stream.flush()
        assert streamed == tok.decode(ids)


def test_stream_decoder_holds_an_unfinished_character(tok):
    lead = tok._bpe.encode_single_token("€".encode()[:1])  # a token of one byte: 0xE2, a 3-byte lead
    rest = tok._bpe.encode_single_token("€".encode()[1:])
    stream = StreamDecoder(tok)
    assert stream.push(lead) == ""
    assert stream.push(rest) == "€"
    assert stream.push(lead) == ""
    assert stream.flush() == b"\xe2".decode("utf-8", errors="replace") == "\ufffd"
    assert stream.push(tok.encode("ok")[0]) == "ok"  # flush starts over


# --- chat format


DIALOGS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a helpful assistant. Answer in one line."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And in Chinese? 用中文回答 🦙"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": SAMPLES["special_lookalikes"]},
        {"role": "assistant", "content": SAMPLES["code"]},
        {"role": "tool", "content": '{"result": 42}\n'},
        {"role": "user", "content": "  leading and trailing spaces \n\n"},
    ],
    [],
]


@pytest.mark.parametrize("index", range(len(DIALOGS)))
def test_dialog_matches_meta_chat_format(tok, meta, index):
    dialog = DIALOGS[index]
    reference = chat_format.ChatFormat(meta)
    expected = reference.encode_dialog_prompt([RawMessage(**m) for m in dialog]).tokens
    assert tok.encode_dialog(dialog) == expected
    header = reference._encode_header("assistant")
    assert tok.encode_dialog(dialog, add_generation_prompt=False) == expected[: -len(header)]
    assert tok.encode_header("assistant") == header


def test_dialog_layout(tok):
    ids = tok.encode_dialog([{"role": "user", "content": "Hi"}])
    text = tok.decode(ids)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert ids[0] == 128000 and ids.count(128009) == 1 and ids.count(128006) == 2
    assert tok.encode_message({"role": "ipython", "content": "x"}) == tok.encode_message(
        {"role": "tool", "content": "x"}
    )


def test_dialog_rejects_bad_messages(tok):
    with pytest.raises(ValueError, match="message 1: unknown chat role 'robot'"):
        tok.encode_dialog([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ValueError, match="message 0: .*'role' and 'content'"):
        tok.encode_dialog([{"role": "user"}])
    with pytest.raises(TypeError, match="message 0: message content must be a str"):
        tok.encode_dialog([{"role": "user", "content": ["a"]}])
    with pytest.raises(TypeError, match="message 0: a chat message is a dict"):
        tok.encode_dialog(["hello"])
    with pytest.raises(TypeError, match="list of messages"):
        tok.encode_dialog({"role": "user", "content": "a"})


# --- finding and reading the ranks file


def test_default_finds_checkpoint_tokenizer(tok, tmp_path):
    for where in (tmp_path / "meta", tmp_path / "hf" / "original"):
        where.mkdir(parents=True)
        shutil.copy(tok.path, where / "tokenizer.model")
    found = Tokenizer.default(tmp_path / "meta")
    assert found.path == tmp_path / "meta" / "tokenizer.model"
    assert Tokenizer.default(tmp_path / "hf").path == tmp_path / "hf" / "original" / "tokenizer.model"
    assert Tokenizer.default(tmp_path / "meta" / "tokenizer.model").path == found.path
    assert found.encode(SAMPLES["english"]) == tok.encode(SAMPLES["english"])


def test_default_falls_back_to_the_package(tok, tmp_path):
    assert Tokenizer.default(tmp_path).path == tok.path
    assert tok.path.parts[-3:] == ("llama_models", "llama3", "tokenizer.model")


def test_default_of_a_path_that_does_not_exist_raises(tok, tmp_path):
    """A mistyped checkpoint must not silently give the shipped tokenizer (a checkpoint's own may differ)."""
    for missing in (tmp_path / "no" / "such" / "dir", "/no/such/dir", tmp_path / "tokenizer.model"):
        with pytest.raises(FileNotFoundError, match=r"does not exist; pass a ranks file") as error:
            Tokenizer.default(missing)
        assert str(missing) in str(error.value) and "Tokenizer.default()" in str(error.value)
    assert Tokenizer.default().path == tok.path  # no argument: the shipped file, as before


def test_default_error_lists_every_place_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "LLAMA_MODELS_PACKAGE", "minillama_no_such_package")
    with pytest.raises(FileNotFoundError) as error:
        Tokenizer.default(tmp_path)
    message = str(error.value)
    assert str(tmp_path / "tokenizer.model") in message
    assert str(tmp_path / "original" / "tokenizer.model") in message
    assert "minillama_no_such_package package (not installed)" in message
    assert "pip install llama-models" in message and "Tokenizer(path)" in message

    # the package is there but its file is not: the message names the file it expected
    (tmp_path / "fake_llama_models").mkdir()
    (tmp_path / "fake_llama_models" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tokenizer_module, "LLAMA_MODELS_PACKAGE", "fake_llama_models")
    with pytest.raises(FileNotFoundError) as error:
        Tokenizer.default()
    assert str(tmp_path / "fake_llama_models" / "llama3" / "tokenizer.model") in str(error.value)
    assert "fake_llama_models" not in sys.modules  # looked up, never imported


def test_missing_or_directory_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found: .*nope.model"):
        Tokenizer(tmp_path / "nope.model")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        Tokenizer(tmp_path)


def test_small_ranks_file(tmp_path):
    # a byte-level BPE with the 256 single bytes and one merge ("ab"): ids follow the file's ranks
    lines = [f"{tokenizer_module.base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines.append(f"{tokenizer_module.base64.b64encode(b'ab').decode()} 256")
    path = tmp_path / "tiny.model"
    path.write_text("\n".join(lines) + "\n")
    small = Tokenizer(path)
    assert small.n_words == 257 + 256 and small.bos_id == 257 and small.eot_id == 257 + 9
    assert small.encode("abc", bos=True) == [257, 256, ord("c")]
    assert small.decode([256, ord("c"), small.eot_id]) == "abc<|eot_id|>"


def test_malformed_ranks_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "BPE"}}\n')
    with pytest.raises(ValueError, match="line 1 is not '<base64 bytes> <rank>'"):
        Tokenizer(bad)
    gappy = tmp_path / "gappy.model"
    gappy.write_text("YQ== 0\nYg== 2\n")
    with pytest.raises(ValueError, match="not 0..1 each once"):
        Tokenizer(gappy)


def test_exported_from_the_package():
    import minillama

    assert minillama.Tokenizer is Tokenizer
