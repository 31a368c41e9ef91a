"""The models a benchmark measures: minillama's (random weights or a checkpoint) and its Hugging Face
peer holding the same weights (chapters 7-8).

Not here: how they are run and timed (`variants.py`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..accounting import weight_bytes
from ..config import MODELS, ModelArgs
from ..model import random_model

# HF's copy of the weights goes through `save` + `from_pretrained` up to this size, in memory above it
HF_VIA_DISK_BYTES = 2 * 2**30


def build_model(model: str | ModelArgs | os.PathLike, device, dtype, seed: int = 0, max_seq_len=None):
    """A model to measure: a `MODELS` name or `ModelArgs` (random weights, seeded), or a checkpoint folder."""
    if isinstance(model, ModelArgs) or model in MODELS:
        args = MODELS[model] if isinstance(model, str) else model
        return random_model(args, device, dtype, seed)
    if Path(model).is_dir():
        from ..checkpoint import load

        return load(model, device=device, dtype=dtype, progress=False, max_seq_len=max_seq_len)
    raise ValueError(
        f"model {str(model)!r} is neither a catalogue name ({', '.join(MODELS)}) nor a checkpoint folder"
    )


def hf_peer(model: nn.Module):
    """Hugging Face's `LlamaForCausalLM` holding `model`'s weights, on its device and dtype, with
    transformers' default attention. Written by `ml.save` (HF names, wq/wk permuted to HF's rotary
    layout) and read by `from_pretrained`; above a few GiB the same tensors are handed over in memory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from ..checkpoint import hf_config, hf_permute, meta_to_hf, save

    w = model.output.weight
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config-range notes about tiny configs, load reports
    hf_logging.disable_progress_bar()
    try:
        if weight_bytes(model.args, w.element_size()) <= HF_VIA_DISK_BYTES:
            with tempfile.TemporaryDirectory() as folder:
                save(model, folder)
                hf = LlamaForCausalLM.from_pretrained(folder, dtype=w.dtype).to(w.device)
        else:
            a = model.args
            with torch.device(w.device):
                hf = LlamaForCausalLM._from_config(LlamaConfig(**hf_config(a, w.dtype)), dtype=w.dtype)
            heads = {"attention.wq.weight": a.n_heads, "attention.wk.weight": a.n_kv_heads}
            state = {}
            for name, t in model.state_dict().items():
                n = next((h for suffix, h in heads.items() if name.endswith(suffix)), None)
                state[meta_to_hf(name)] = hf_permute(t, n) if n else t
            hf.load_state_dict(state, strict=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    # no end-of-text stop: both sides generate exactly the tokens asked for (minillama's bench loop has
    # no stop check either), which also spares HF its per-step check
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()
