"""The Llama 3 tokenizer: byte-level BPE on tiktoken, 128,000 ranks + 256 special tokens (chapter 6).

Text becomes ids in two steps. A regular expression splits the text into pieces (a word with the
character before it, numbers of at most three digits, runs of punctuation, runs of whitespace), then
byte-pair encoding turns the UTF-8 bytes of each piece into ranks: starting from single bytes, the
adjacent pair whose merge has the lowest rank in `tokenizer.model` is merged until no pair is left in
the table. The ids of the ranks are 0..127,999; the 256 special tokens follow at 128,000..128,255, so
the model's vocabulary is v = 128,256. Special tokens never come out of text: they are put in by id.

What this module reproduces, from Meta's reference (repository meta-llama/llama-models, the code of
the `llama-models==0.3.0` wheel, commit 0e0b8c5; repository path `models/llama3/tokenizer.py`,
installed as `llama_models/llama3/tokenizer.py` with the same line numbers):

- lines 33-40: tiktoken is called on at most 400,000 characters at a time, and no piece handed to it
  holds more than 25,000 consecutive whitespace or non-whitespace characters (Meta's comments cite a
  pyo3 panic on longer inputs and tiktoken issue 195); the cuts change the tokens, so they are copied
  exactly (100,000 spaces give 784 ids cut, 782 uncut);
- line 55: the split pattern (`PAT_STR` below is that pattern);
- lines 77-96: the special token names, in id order from 128,000;
- lines 104-116: bos, eos, eot, eom, pad ids and the stop tokens (eos, eom, eot);
- lines 148-172: `encode`: 400,000-character windows, each cut by lines 187-209 (a cut every 25,000
  characters inside a longer run of whitespace or of non-whitespace, counted from the run's start
  within the window), then bos/eos around the ids;
- `models/tokenizer_utils.py` lines 15-40: the ranks file: one `<base64 bytes> <rank>` per line;
- `models/llama3/chat_format.py` lines 42-49 (role "tool" is written "ipython"), 61-67 (a header:
  `<|start_header_id|>`, the role as text, `<|end_header_id|>`, "\\n\\n" as text), 108-144 (a message:
  header, content, `<|eot_id|>`), 146-163 (a dialog: `<|begin_of_text|>`, the messages, an assistant
  header for the model to complete).

Where this module differs from Meta's reference, on purpose:

- `encode` has no `allowed_special` / `disallowed_special`: text that looks like a special token is
  always encoded as plain text (`"<|eot_id|>"` gives 7 ordinary ids, never 128009). Meta's wrapper
  does the same by default (`disallowed_special=()`, no allowed specials); tiktoken's own
  `Encoding.encode` default would raise instead, and Meta's `allowed_special="all"` would produce
  special ids from user text. Put special tokens in by id (`tok.special_tokens[...]`), as
  `encode_dialog` does.
- A malformed ranks file raises `ValueError` naming the line; Meta's loader logs and skips the line.
- `decode` checks ids against the vocabulary and raises `ValueError`; tiktoken raises `KeyError`.
- Chat messages are plain text: every message ends with `<|eot_id|>`. Meta's `encode_message` can
  also end an assistant message with `<|eom_id|>` (its `stop_reason`), and adds tool calls, images
  and retrieval context, which are not modelled here.
- Names follow llama-models 0.3.0, which calls 128005 `<|step_id|>` and 128011 `<|image|>` and numbers
  the remaining reserved tokens from 2 at 128012 (up to `<|reserved_special_token_245|>` at 128255).
  The Hugging Face Llama 3.1 release calls 128005 and 128011 reserved tokens 2 and 3 (up to
  `<|reserved_special_token_247|>`). The ids of every named token used in chat are the same in both.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import importlib.util
import operator
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import tiktoken

# Meta's split pattern (models/llama3/tokenizer.py line 55): contractions, an optional non-letter
# followed by letters, 1-3 digits, punctuation runs with trailing newlines, newline runs, whitespace.
PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MAX_ENCODE_CHARS = 400_000  # characters per tiktoken call
MAX_RUN_CHARS = 25_000  # consecutive whitespace or non-whitespace characters per tiktoken call
NUM_SPECIAL_TOKENS = 256
TOKENIZER_FILE = "tokenizer.model"
LLAMA_MODELS_PACKAGE = "llama_models"  # the pip package llama-models ships the ranks file

# special tokens with a name of their own, by offset from the first special id (128000 for Llama 3);
# every other offset k is <|reserved_special_token_{k - 10}|>, except 2 and 3 (reserved 0 and 1).
_NAMED_SPECIAL = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    2: "<|reserved_special_token_0|>",
    3: "<|reserved_special_token_1|>",
    4: "<|finetune_right_pad_id|>",
    5: "<|step_id|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",  # end of message: the model expects a tool result next
    9: "<|eot_id|>",  # end of turn
    10: "<|python_tag|>",
    11: "<|image|>",
}

# chat roles and how their header spells them (Meta writes the "tool" role as "ipython")
CHAT_ROLES = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "ipython": "ipython",
    "tool": "ipython",
}

# a run of whitespace or of non-whitespace longer than MAX_RUN_CHARS; the lookbehinds anchor each
# match at the start of its run, so scanning stays linear in the text length. Python's `\s` is
# `str.isspace`, the test Meta's splitter uses.
_LONG_RUN = re.compile(rf"(?<!\s)\s{{{MAX_RUN_CHARS + 1},}}|(?<!\S)\S{{{MAX_RUN_CHARS + 1},}}")


def special_token_names(count: int = NUM_SPECIAL_TOKENS) -> list[str]:
    """The special token names in id order (the first is `<|begin_of_text|>`)."""
    return [_NAMED_SPECIAL.get(k, f"<|reserved_special_token_{k - 10}|>") for k in range(count)]


def load_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a tiktoken ranks file: one `<base64 bytes> <rank>` per line, ranks 0..n-1."""
    path = Path(path)
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            try:
                if len(fields) != 2:
                    raise ValueError("expected two fields")
                ranks[base64.b64decode(fields[0], validate=True)] = int(fields[1])
            except (ValueError, binascii.Error):
                raise ValueError(
                    f"{path}: line {lineno} is not '<base64 bytes> <rank>' (found {line[:60]!r}); "
                    f"pass the Llama 3 {TOKENIZER_FILE} (a Hugging Face tokenizer.json is not read; "
                    f"Meta's file sits under original/ in Hugging Face checkpoints)"
                ) from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(
            f"{path}: the {len(ranks)} ranks are not 0..{len(ranks) - 1} each once; the file is not a "
            f"complete tiktoken ranks file"
        )
    return ranks


def _tiktoken_pieces(text: str) -> Iterator[str]:
    """Cut `text` the way Meta's `encode` does before calling tiktoken (see the module docstring)."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        window = text[start : start + MAX_ENCODE_CHARS]
        cut = 0
        for run in _LONG_RUN.finditer(window):
            for at in range(run.start() + MAX_RUN_CHARS, run.end(), MAX_RUN_CHARS):
                yield window[cut:at]
                cut = at
        yield window[cut:]


class Tokenizer:
    """Llama 3 tokenizer: `encode` text to ids, `decode` ids to text, `encode_dialog` for chat.

    >>> tok = Tokenizer.default()
    >>> tok.encode("Hello", bos=True)
    [128000, 9906]
    """

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if path.is_dir():
            raise FileNotFoundError(
                f"{path} is a directory, not a ranks file; pass the {TOKENIZER_FILE} inside it, or use "
                f"Tokenizer.default(checkpoint={str(path)!r}) to look inside it"
            )
        if path.suffix.lower() == ".gguf":
            raise ValueError(f"{path} is a GGUF file, not a ranks file; use Tokenizer.default({str(path)!r})")
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer file not found: {path}; pass the path of a Llama 3 {TOKENIZER_FILE}, or use "
                f"Tokenizer.default() for the one shipped with `pip install llama-models`"
            )
        self.path = path
        ranks = load_ranks(path)
        self.n_base_tokens = len(ranks)  # 128,000 for Llama 3
        names = special_token_names()
        self.special_tokens: dict[str, int] = {name: self.n_base_tokens + k for k, name in enumerate(names)}
        self._special_names = {i: name for name, i in self.special_tokens.items()}
        self._bpe = tiktoken.Encoding(
            name=path.name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=dict(self.special_tokens)
        )
        self.n_words = self.n_base_tokens + len(names)  # 128,256: the model's vocab_size
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.special_tokens["<|end_of_text|>"]
        self.eot_id = self.special_tokens["<|eot_id|>"]
        self.eom_id = self.special_tokens["<|eom_id|>"]
        self.pad_id = self.special_tokens["<|finetune_right_pad_id|>"]
        self.python_tag_id = self.special_tokens["<|python_tag|>"]
        self.start_header_id = self.special_tokens["<|start_header_id|>"]
        self.end_header_id = self.special_tokens["<|end_header_id|>"]
        # generation stops at any of these (Meta's order: eos, eom, eot)
        self.stop_tokens = (self.eos_id, self.eom_id, self.eot_id)

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.path.name}: {self.n_base_tokens:,} ranks + {len(self.special_tokens)} special "
            f"tokens = {self.n_words:,} ids)"
        )

    @classmethod
    def default(cls, checkpoint: str | os.PathLike | None = None) -> Tokenizer:
        """The tokenizer of a checkpoint, else the one shipped with the llama-models package.

        `checkpoint` may be a GGUF file (its own vocabulary: this class for Llama 3's, else a
        `GGUFTokenizer` with the same interface, see `tokenizer_gguf.py`), a ranks file, or a directory holding `tokenizer.model` (Meta's layout) or
        `original/tokenizer.model` (Hugging Face's copy of Meta's files). Without one there, every
        Llama 3.x model shares the ranks file shipped in `llama_models/llama3/`. A `checkpoint` that does
        not exist raises `FileNotFoundError` (it is a mistake, not a request for the shipped file).
        """
        looked: list[str] = []
        if checkpoint is not None:
            checkpoint = Path(checkpoint)
            if not checkpoint.exists():  # a typo must not fall back to the shipped ranks silently
                raise FileNotFoundError(
                    f"{checkpoint} does not exist; pass a ranks file ({TOKENIZER_FILE}), a .gguf file or a checkpoint "
                    f"directory, or call Tokenizer.default() for the Llama 3 ranks shipped with llama-models"
                )
            if checkpoint.is_file() and checkpoint.suffix.lower() == ".gguf":
                return cls._from_gguf(checkpoint)
            if checkpoint.is_file():
                return cls(checkpoint)
            for candidate in (checkpoint / TOKENIZER_FILE, checkpoint / "original" / TOKENIZER_FILE):
                if candidate.is_file():
                    return cls(candidate)
                looked.append(str(candidate))
            # a folder holding one GGUF file and no other checkpoint: `load` reads that file, so its vocabulary
            ggufs = sorted(checkpoint.glob("*.gguf")) if checkpoint.is_dir() else []
            others = [n for n in ("config.json", "params.json") if (checkpoint / n).is_file()]
            if len(ggufs) == 1 and not others:
                return cls._from_gguf(ggufs[0])
        try:
            spec = importlib.util.find_spec(LLAMA_MODELS_PACKAGE)  # locates the package, runs none of it
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            looked.append(f"the {LLAMA_MODELS_PACKAGE} package (not installed)")
        else:
            for location in spec.submodule_search_locations:
                candidate = Path(location) / "llama3" / TOKENIZER_FILE
                if candidate.is_file():
                    return cls(candidate)
                looked.append(str(candidate))
        raise FileNotFoundError(
            f"no Llama 3 {TOKENIZER_FILE} found; looked in: {'; '.join(looked)}. "
            f"Fix: `pip install llama-models` (it ships the file), or pass a path: "
            f"Tokenizer(path) or Tokenizer.default(checkpoint=DIR)"
        )

    @classmethod
    def _from_gguf(cls, path: Path):
        """A GGUF file's tokenizer: this class when the file holds the Llama 3 vocabulary (Meta's ranks
        spelled in GPT-2's byte alphabet, the same special names), else a `GGUFTokenizer` on the file's
        tokens and merges (`tokenizer_gguf.py`)."""
        from .tokenizer_gguf import LLAMA3_PRE, GGUFTokenizer, byte_alphabet, gguf_vocabulary, spelled

        _, pre, tokens = gguf_vocabulary(path)
        if pre in LLAMA3_PRE and len(tokens) == 128_000 + NUM_SPECIAL_TOKENS:
            try:
                llama3 = cls.default()
            except FileNotFoundError:  # no llama-models package: the file's own BPE gives the same ids
                llama3 = None
            if llama3 is not None:
                spelling = byte_alphabet()
                names = llama3.special_tokens.items()
                if all(tokens[i] == spelled(llama3.token_bytes(i), spelling) for i in range(llama3.n_base_tokens)) \
                        and all(tokens[i] == name for name, i in names):
                    return llama3
        return GGUFTokenizer(path, llama3_pattern=PAT_STR)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of `text` (special-token text stays plain text), with bos/eos around them if asked."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes to str first")
        ids = [self.bos_id] if bos else []
        for piece in _tiktoken_pieces(text):
            ids.extend(self._bpe.encode_ordinary(piece))
        if eos:
            ids.append(self.eos_id)
        return ids

    def _check_ids(self, ids) -> list[int]:
        if hasattr(ids, "tolist"):  # torch tensor or numpy array
            if ids.ndim != 1:
                raise ValueError(f"decode takes a 1-d sequence of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = list(ids)
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.n_words:
                raise ValueError(f"token id {i!r} is not an integer in 0..{self.n_words - 1} (vocab_size)")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (a list, tuple or 1-d tensor); special tokens appear as their names.

        Bytes that are not valid UTF-8 (a sequence cut inside a character) become U+FFFD.
        """
        return self._bpe.decode(self._check_ids(ids))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (a special token: its name in UTF-8)."""
        (token_id,) = self._check_ids([operator.index(token_id)])
        return self._bpe.decode_single_token_bytes(token_id)

    def is_special(self, token_id: int) -> bool:
        return operator.index(token_id) in self._special_names

    def encode_header(self, role: str) -> list[int]:
        """`<|start_header_id|>role<|end_header_id|>` then "\\n\\n": what opens every chat message."""
        if role not in CHAT_ROLES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(CHAT_ROLES)}")
        return [
            self.start_header_id,
            *self.encode(CHAT_ROLES[role]),
            self.end_header_id,
            *self.encode("\n\n"),
        ]

    def encode_message(self, message: Mapping[str, str]) -> list[int]:
        """A chat message {"role": ..., "content": ...}: header, content as plain text, `<|eot_id|>`."""
        if not isinstance(message, Mapping):
            raise TypeError(f"a chat message is a dict with 'role' and 'content', got {message!r}")
        if "role" not in message or "content" not in message:
            raise ValueError(f"a chat message is a dict with 'role' and 'content', got {message!r}")
        content = message["content"]
        if not isinstance(content, str):
            raise TypeError(f"message content must be a str, got {type(content).__name__}: {content!r}")
        return [*self.encode_header(message["role"]), *self.encode(content), self.eot_id]

    def encode_dialog(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Llama 3.1 chat format: `<|begin_of_text|>`, each message, then (if asked) an assistant header."""
        if isinstance(messages, (str, Mapping)):
            raise TypeError(
                "encode_dialog takes a list of messages, e.g. [{'role': 'user', 'content': 'Hi'}]"
            )
        ids = [self.bos_id]
        for index, message in enumerate(messages):
            try:
                ids.extend(self.encode_message(message))
            except (TypeError, ValueError) as error:
                raise type(error)(f"message {index}: {error}") from None
        if add_generation_prompt:
            ids.extend(self.encode_header("assistant"))
        return ids


class StreamDecoder:
    """Turns ids into text one at a time, emitting only whole characters.

    One token can end in the middle of a multi-byte UTF-8 character (an emoji is 4 bytes, often split
    over two tokens); decoding tokens one by one would print U+FFFD for each half. `push` keeps the
    unfinished bytes until the character is complete; `flush` returns what is left (U+FFFD for bytes
    that never completed a character). Joined, the pieces equal `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
