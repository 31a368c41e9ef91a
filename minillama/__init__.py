"""minillama: Llama 3.1 from the inside, one module per concept.

Axis names used in code, cards, prose and figures: b batch, t new positions, s keys read (cached + new),
d model width, h query heads, kv key/value heads, g query heads per KV head (h = kv · g), hd head width,
p rotary pairs (hd / 2), v vocabulary.
"""

__version__ = "0.1.0"

# first: a Python without torch, einops, ... gets one line saying which Python to use
from . import _requires  # isort: skip
from . import inspect, notebook
from .accounting import (
    count_parameters,
    decode_step_bytes,
    flops_per_token,
    kv_cache_bytes,
    tensor_parallel_bytes,
    tensor_parallel_traffic,
    weight_bytes,
)
from .attention import Attention
from .cards import card, card_tabs, tensor_card
from .checkpoint import load, load_args, save, save_gguf
from .compiled import compile_decode
from .config import MODELS, ModelArgs
from .decode import decode_one_token, prefill
from .fetch import fetch
from .ffn import FeedForward
from .generate import generate
from .kv_cache import KVCache
from .model import Transformer, TransformerBlock
from .norm import RMSNorm
from .quantize import quantize
from .rope import RotaryEmbedding, apply_rotary, inv_freq
from .sampling import sample
from .serving import Engine, SamplingParams
from .tokenizer import Tokenizer


def __getattr__(name: str):
    # the tensor-parallel entry point (chapter 11) imports torch.distributed's DTensor machinery, about
    # a second: only when it is first used, not on every `import minillama`
    if name == "parallelize":
        from .distributed import parallelize

        return parallelize
    raise AttributeError(f"module 'minillama' has no attribute {name!r}")
