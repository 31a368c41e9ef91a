"""Which checkpoint layout a folder holds, and where its files are (chapter 6).

- Meta's: `params.json` and `consolidated.00.pth` ... `consolidated.NN.pth`, one file per
  model-parallel rank;
- Hugging Face's: `config.json` and `model.safetensors`, or shards `model-0000N-of-0000M.safetensors`
  listed in `model.safetensors.index.json`. Hugging Face's model repositories also ship Meta's files
  under `original/`; those are read when the top level holds no Hugging Face weights;
- a GGUF file (llama.cpp, Ollama, LM Studio): one `.gguf` holding config, tokenizer and weights.

Not here: reading the config (`configs.py`) or the weights (`read_hf.py`, `read_meta.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

META_PARAMS = "params.json"
HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
ORIGINAL = "original"  # where Hugging Face repositories keep Meta's files
GGUF_SUFFIX = ".gguf"  # llama.cpp's single-file format (`read_gguf.py`)


def read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None


def _listing(root: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} entries)" if len(names) > 20 else "")
    return shown or "nothing (the folder is empty)"


def meta_shards(root: Path) -> list[Path]:
    return sorted(root.glob("consolidated.*.pth"))


def hf_files(root: Path) -> list[Path] | None:
    """The safetensors files of a Hugging Face checkpoint in `root`, or None when there are none."""
    if (root / HF_INDEX).is_file():
        weight_map = read_json(root / HF_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{root / HF_INDEX} has no 'weight_map' from tensor names to files")
        files = sorted({root / name for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(
                    f"{file} is listed in {HF_INDEX} but does not exist; the download is incomplete"
                )
        return files
    if (root / HF_WEIGHTS).is_file():
        return [root / HF_WEIGHTS]
    shards = sorted(root.glob("model-*-of-*.safetensors"))
    return shards or None


def detect_layout(path: str | os.PathLike) -> tuple[str, Path]:
    """("hf" or "meta", the folder holding the files) for a checkpoint folder (or a file in it), or
    ("gguf", the file) for a `.gguf` file or a folder holding exactly one and no other checkpoint."""
    path = Path(path).expanduser()
    if not path.exists():
        from ..fetch import SHIPPED

        hint = f"; {str(path)!r} is a model ml.fetch gets: ml.load(ml.fetch({str(path)!r}))" if str(path) in SHIPPED else ""
        raise FileNotFoundError(f"checkpoint path does not exist: {path}{hint}")
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return "gguf", path
    root = path if path.is_dir() else path.parent
    if (root / HF_CONFIG).is_file() and hf_files(root):
        return "hf", root
    for folder in (root, root / ORIGINAL):
        if (folder / META_PARAMS).is_file() and meta_shards(folder):
            return "meta", folder
    ggufs = sorted(p for p in root.iterdir() if p.suffix.lower() == GGUF_SUFFIX and p.is_file())
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    hint = ""
    names = {p.name for p in root.iterdir()}
    if any(n.endswith(".bin") for n in names):
        hint = " PyTorch .bin weights are not read (they unpickle code); convert them to safetensors."
    elif any(n.endswith(".gguf") for n in names):
        hint = f" It holds {len(ggufs)} GGUF files: pass the path of the one to load."
    elif (root / HF_CONFIG).is_file():
        hint = f" {HF_CONFIG} is there but no {HF_WEIGHTS}, {HF_INDEX} or model-*-of-*.safetensors."
    elif (root / META_PARAMS).is_file():
        hint = f" {META_PARAMS} is there but no consolidated.*.pth."
    raise ValueError(
        f"{root} is not a checkpoint minillama knows. Found: {_listing(root)}. Expected Hugging Face "
        f"({HF_CONFIG} + {HF_WEIGHTS} or sharded model-0000N-of-0000M.safetensors + {HF_INDEX}) or Meta "
        f"({META_PARAMS} + consolidated.00.pth), possibly under {ORIGINAL}/.{hint}"
    )
