"""Load Meta, Hugging Face and GGUF checkpoints of Llama 3.1; save safetensors (chapter 6).

Three layouts hold the same weights: Meta's (`params.json` + `consolidated.NN.pth`, one file per
model-parallel rank, this package's parameter names), Hugging Face's (`config.json` + safetensors,
HF names, wq/wk rows permuted for its half-split rotary pairs) and llama.cpp's GGUF (one file: metadata,
tokenizer and weights, often quantised, wq/wk in Meta's order). `load` detects the layout, translates
the config, checks every name, shape and dtype before reading a weight, undoes HF's permutation (so one
attention code path serves all three), dequantises GGUF tensors and merges Meta's shards; `save` writes Hugging Face's layout, `save_gguf` llama.cpp's.

    model = ml.load("path/to/checkpoint", device="cuda", dtype=torch.bfloat16)
    ml.save(model, "out/")

Where things live:
- `layout.py`: which layout a folder holds, and its files;
- `names.py`: HF <-> Meta parameter names and the q/k permutation;
- `configs.py`: `config.json` / `params.json` <-> `ModelArgs`;
- `check.py`, `read_hf.py`, `read_meta.py`, `read_gguf.py`, `load.py`: checking, reading and loading;
- `save.py`: writing a Hugging Face checkpoint;
- `write_gguf.py`: writing a GGUF file (F32, F16, BF16, Q8_0, Q4_0, Q4_1) that llama.cpp runs.
"""

from .check import SUPPORTED_DTYPES
from .configs import args_from_hf_config, args_from_meta_params, hf_config, load_args
from .layout import HF_CONFIG, HF_INDEX, HF_WEIGHTS, META_PARAMS, ORIGINAL, detect_layout
from .load import load
from .names import hf_permute, hf_to_meta, hf_unpermute, meta_to_hf
from .read_gguf import args_from_gguf, gguf_to_meta, open_gguf
from .save import save
from .write_gguf import GGUF_TYPES, save_gguf

__all__ = [
    "HF_CONFIG",
    "HF_INDEX",
    "HF_WEIGHTS",
    "META_PARAMS",
    "ORIGINAL",
    "SUPPORTED_DTYPES",
    "args_from_gguf",
    "args_from_hf_config",
    "args_from_meta_params",
    "detect_layout",
    "gguf_to_meta",
    "hf_config",
    "hf_permute",
    "hf_to_meta",
    "hf_unpermute",
    "load",
    "load_args",
    "meta_to_hf",
    "open_gguf",
    "save",
    "save_gguf",
    "GGUF_TYPES",
]
