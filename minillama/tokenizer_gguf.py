"""The tokenizer a GGUF file carries: its vocabulary, merges, special tokens and chat template (chapter 6).

A GGUF holds no tokenizer file; llama.cpp stores the tokenizer as metadata: `tokenizer.ggml.model`
("gpt2" for byte-level BPE), `tokenizer.ggml.pre` (which split pattern the merges were learned with),
`tokenizer.ggml.tokens` (each id's token, spelled in GPT-2's byte alphabet), `tokenizer.ggml.merges`,
`tokenizer.ggml.token_type` (3 marks a control token such as `<|im_end|>`), the bos / eos / end-of-turn
ids, and `tokenizer.chat_template` (Jinja). `Tokenizer.default(path_to.gguf)` returns:

- a Llama 3 vocabulary (128,256 tokens, the `llama-bpe` split, the same tokens as Meta's ranks): the
  package's own `Tokenizer.default()`, so a Llama 3.x GGUF from Ollama gives the ids Meta's reference gives;
- any other byte-level BPE vocabulary (SmolLM2's): a `GGUFTokenizer`, whose BPE runs in Hugging Face's
  `tokenizers` library (not a hand-written BPE), built from the file's tokens and merges. How the file's
  fields become a `tokenizers` BPE follows the same reading of the format as transformers' converter
  (huggingface/transformers v5.24.0, `src/transformers/integrations/gguf/gguf_tokenizer_mapping.py`,
  `byte_level_tokenizer` and `add_gguf_special_tokens`); the split patterns are llama.cpp's for each
  `tokenizer.ggml.pre` (ggml-org/llama.cpp at eb6a99c, `src/llama-vocab.cpp`, the constructor of
  `llm_tokenizer_bpe`, case `LLAMA_VOCAB_PRE_TYPE_SMOLLM`: "smollm" shares StarCoder's split, every
  digit on its own, then GPT-2's pattern). transformers' converter omits that digit split for "smollm",
  so its ids differ from the file's where spaces precede a number ("x=  42"); tests/test_gguf.py shows
  both. The chat format is the file's own template, rendered
  with jinja2 as transformers' `apply_chat_template` renders it (a sandbox, `trim_blocks`, `lstrip_blocks`).

The choice between the two is made by `Tokenizer.default` (`tokenizer.py`), which imports this module
when it is given a `.gguf` file; this module imports nothing of `tokenizer.py`.

A `GGUFTokenizer` has the interface of `Tokenizer`: `encode(text, bos=, eos=)`, `decode(ids)`,
`encode_dialog(messages)`, `token_bytes` (so `StreamDecoder` streams it), `stop_tokens`, `bos_id`,
`eos_id`, `vocab_size`. Two differences follow the file: `bos=True` adds the beginning-of-text id only
when the vocabulary uses one (`tokenizer.ggml.add_bos_token`; SmolLM2's does not, as in transformers);
and the chat template's text is encoded with its special tokens recognised (as transformers and
llama.cpp do), while `encode` keeps special-token text plain, as `Tokenizer.encode` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

CONTROL = 3  # tokenizer.ggml.token_type of a control (special) token
USER_DEFINED = 4  # an added token that is matched whole in text but is not special
# llama.cpp's split before byte-level BPE, by `tokenizer.ggml.pre` (see the module docstring):
# None: GPT-2's pattern (the one `tokenizers`' ByteLevel applies itself)
_DIGITS = r"\p{N}"  # StarCoder-style vocabularies (SmolLM2) split every digit off first
SPLITS = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "smollm": _DIGITS,
    "starcoder": _DIGITS,
    "refact": _DIGITS,
    "codeshell": _DIGITS,
}
LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3")  # Llama 3's split: `tokenizer.PAT_STR`, passed in


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values (openai/gpt-2 `src/encoder.py`,
    `bytes_to_unicode`): printable Latin-1 bytes stand for themselves, the other 68 for the characters
    from U+0100 on, in byte order. BPE vocabularies of this family write their tokens in it."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def gguf_vocabulary(path: str | os.PathLike) -> tuple[str, str, list[str]]:
    """(tokenizer.ggml.model, tokenizer.ggml.pre, tokens) of the GGUF file at `path`."""
    path = Path(path).expanduser()
    meta = _metadata(path)
    kind, pre, tokens = (
        meta("tokenizer.ggml.model"),
        meta("tokenizer.ggml.pre", "default"),
        meta("tokenizer.ggml.tokens"),
    )
    if kind is None or tokens is None:
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.model or tokenizer.ggml.tokens)")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model is {kind!r}; minillama reads byte-level BPE vocabularies ('gpt2': "
            f"Llama 3, SmolLM2), not sentencepiece ('llama': Llama 2, Mistral) or others"
        )
    return kind, pre, list(tokens)


def spelled(token: bytes, spelling: dict[int, str]) -> str:
    return "".join(spelling[b] for b in token)


def _metadata(path: Path):
    from .checkpoint.read_gguf import field, open_gguf

    reader = open_gguf(path)
    return lambda key, default=None: field(reader, key, default)


class GGUFTokenizer:
    """A byte-level BPE tokenizer read from a GGUF file, run by Hugging Face `tokenizers` (module docstring).

    >>> tok = ml.Tokenizer.default(ml.fetch("smollm2-135m"))
    >>> tok.encode("Hello")
    [19556]
    """

    def __init__(self, path: str | os.PathLike, llama3_pattern: str | None = None):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as BPETokenizer

        self.path = Path(path).expanduser()
        meta = _metadata(self.path)
        _, pre, tokens = gguf_vocabulary(self.path)
        splits = {**SPLITS, **({p: llama3_pattern for p in LLAMA3_PRE} if llama3_pattern else {})}
        if pre not in splits:
            raise ValueError(
                f"{self.path}: tokenizer.ggml.pre is {pre!r}, a split pattern minillama does not know; known: "
                f"{', '.join(sorted(splits))}"
            )
        merges = meta("tokenizer.ggml.merges")
        if not merges:
            raise ValueError(
                f"{self.path}: a byte-level BPE vocabulary needs tokenizer.ggml.merges; the file has none"
            )
        types = list(meta("tokenizer.ggml.token_type", None) or [1] * len(tokens))
        spelling = byte_alphabet()
        self._byte_of = {c: b for b, c in spelling.items()}
        alphabet = set(self._byte_of)
        # a token spelled outside the byte alphabet (a control token such as "<|im_end|>" is inside it;
        # some files store plain text) is respelled, as transformers does
        spelled = [
            t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens
        ]
        self.tokens = tokens
        self.special_tokens = {tokens[i]: i for i, kind in enumerate(types) if kind == CONTROL}
        self._special_ids = set(self.special_tokens.values())
        self._added_ids = {i for i, kind in enumerate(types) if kind == USER_DEFINED}

        def build(with_special: bool):
            bpe = BPETokenizer(
                models.BPE(
                    vocab={t: i for i, t in enumerate(spelled)},
                    merges=[tuple(m.split(" ")) for m in merges],
                    fuse_unk=False,
                )
            )
            split = splits[pre]
            if split is None:
                bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            else:
                bpe.pre_tokenizer = pre_tokenizers.Sequence(
                    [
                        pre_tokenizers.Split(Regex(split), behavior="isolated"),
                        # the StarCoder split then applies GPT-2's pattern; Llama 3's pattern is the whole split
                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split == _DIGITS),
                    ]
                )
            bpe.decoder = decoders.ByteLevel()
            added = [AddedToken(tokens[i], normalized=False, special=False) for i in sorted(self._added_ids)]
            if added:
                bpe.add_tokens(added)
            if with_special:
                bpe.add_special_tokens(
                    [AddedToken(tokens[i], normalized=False, special=True) for i in sorted(self._special_ids)]
                )
            return bpe

        self._plain = build(with_special=False)  # `encode`: special-token text stays text
        self._templated = build(with_special=True)  # the chat template's text: its special tokens are ids
        self.n_words = len(tokens)
        self.bos_id = meta("tokenizer.ggml.bos_token_id")
        self.eos_id = meta("tokenizer.ggml.eos_token_id")
        self.eot_id = meta("tokenizer.ggml.eot_token_id")
        self.eom_id = meta("tokenizer.ggml.eom_token_id")
        self.pad_id = meta("tokenizer.ggml.padding_token_id")
        self.adds_bos = bool(meta("tokenizer.ggml.add_bos_token", False)) and self.bos_id is not None
        # generation stops at the ids the file names as ends (SmolLM2: eos is <|im_end|>, the end of a turn)
        self.stop_tokens = tuple(
            dict.fromkeys(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        )
        self.chat_template = meta("tokenizer.chat_template")

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def __repr__(self) -> str:
        return (
            f"GGUFTokenizer({self.path.name}: {self.n_words:,} tokens, {len(self.special_tokens)} special, "
            f"stop ids {list(self.stop_tokens)})"
        )

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of `text` (special-token text stays plain text); `bos=True` adds the beginning-of-text id
        when the vocabulary uses one, `eos=True` appends the end-of-text id."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes to str first")
        ids = [self.bos_id] if bos and self.adds_bos else []
        ids += self._plain.encode(text, add_special_tokens=False).ids
        if eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _check_ids(self, ids) -> list[int]:
        if hasattr(ids, "tolist"):
            if ids.ndim != 1:
                raise ValueError(f"decode takes a 1-d sequence of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = list(ids)
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.n_words:
                raise ValueError(f"token id {i!r} is not an integer in 0..{self.n_words - 1} (vocab_size)")
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (a special or added token: its text in UTF-8)."""
        (token_id,) = self._check_ids([int(token_id)])
        token = self.tokens[token_id]
        if (
            token_id in self._special_ids
            or token_id in self._added_ids
            or not set(token) <= self._byte_of.keys()
        ):
            return token.encode("utf-8")
        return bytes(self._byte_of[c] for c in token)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; special tokens appear as their names; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(i) for i in self._check_ids(ids)).decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special_ids

    def render_dialog(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat as text, by the file's `tokenizer.chat_template`."""
        if self.chat_template is None:
            raise ValueError(f"{self.path} has no tokenizer.chat_template; encode the prompt as text instead")
        if isinstance(messages, (str, Mapping)):
            raise TypeError(
                "encode_dialog takes a list of messages, e.g. [{'role': 'user', 'content': 'Hi'}]"
            )
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
                raise ValueError(
                    f"message {index}: a chat message is a dict with 'role' and 'content', got {message!r}"
                )
            if not isinstance(message["content"], str):
                raise TypeError(
                    f"message {index}: content must be a str, got {type(message['content']).__name__}"
                )
        return _template(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.tokens[self.bos_id] if self.bos_id is not None else "",
            eos_token=self.tokens[self.eos_id] if self.eos_id is not None else "",
        )

    def encode_dialog(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the chat rendered by the file's template (its special tokens as ids), then, if asked,
        the opening of the assistant's turn for the model to complete."""
        text = self.render_dialog(messages, add_generation_prompt)
        return self._templated.encode(text, add_special_tokens=False).ids


def _template(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
