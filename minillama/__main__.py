"""The command line: `python -m minillama generate | count | card | bench`.

    python -m minillama generate --checkpoint DIR --prompt "The capital of France is"
    python -m minillama generate --checkpoint DIR --chat --prompt "Write a haiku about llamas"
    python -m minillama generate --checkpoint smollm2-135m --chat --prompt "What is the capital of France?"
    python -m minillama generate --model tiny --prompt hi          # random weights, no checkpoint
    torchrun --nproc-per-node 2 -m minillama generate --checkpoint DIR --prompt hi --tp 2   # tensor-parallel
    python -m minillama count llama-3.1-8b                         # the parameter accounting table
    python -m minillama card attention --model llama-3.1-8b --mode decode --positions 1000
    python -m minillama bench                                      # decode/prefill throughput -> benchmarks/local/
    python -m minillama --version
    python -m minillama serve --checkpoint DIR --port 8000         # an OpenAI-compatible server

Bad arguments end with exit code 2 and one line on stderr, before any weights are read or made: settings,
names and paths, the prompt against the context, and the memory random weights of a catalogue shape need.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import torch

from . import __version__
from .accounting import count_parameters, kv_cache_bytes
from .config import MODELS, ModelArgs, unknown_model
from .model import random_model

PROG = "python -m minillama"


class UsageError(Exception):
    """A bad argument: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints the usage and exits; one line is enough
        raise UsageError(f"{message} (see {self.prog} --help)")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every default in --help; an option whose default is None, or a flag, says it in its own words."""

    def _get_help_string(self, action):
        quiet = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        return action.help if quiet else super()._get_help_string(action)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _not_here(path: str, option: str) -> str | None:
    """The message for a checkpoint argument that is no folder here: a Hugging Face hub id (not fetched), a
    file where a folder is expected, or nothing at all; None when `path` is a folder."""
    where = Path(path).expanduser()
    if where.is_dir():
        return None
    if where.is_file():
        return (
            f"{path} is a file; {option} takes the checkpoint's folder (the one holding config.json and "
            f"*.safetensors, or params.json and consolidated.*.pth): pass {where.parent or '.'}"
        )
    if _HUB_ID.fullmatch(path) and not path.startswith("."):
        return (
            f"{path!r} is no folder here; if it is a Hugging Face hub id: hub ids are not fetched, download "
            f"it (e.g. `huggingface-cli download {path} --local-dir DIR`) and pass the folder"
            + (f": {option} DIR" if option.startswith("-") else "")
        )
    return None


def _model_args(name: str) -> ModelArgs:
    if name not in MODELS:
        if _HUB_ID.fullmatch(name):
            raise UsageError(
                f"--model takes a catalogue name ({', '.join(MODELS)}) for random weights; {name!r} looks like "
                f"a Hugging Face hub id, which is not fetched: download it (e.g. `huggingface-cli download "
                f"{name} --local-dir DIR`) and pass the folder: --checkpoint DIR"
            )
        raise UsageError(unknown_model(name, MODELS))
    return MODELS[name]


def _dtype(name: str) -> torch.dtype | None:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(name)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} requested but CUDA is not available (torch {torch.__version__})")
    return device


def _available_bytes(device: torch.device) -> int | None:
    """Memory a new model may take on `device`: free GPU memory, or the kernel's MemAvailable (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
    return None


OVERHEAD = 500_000_000  # torch, the tokenizer and one forward's activations, roughly


def _model_bytes(args: ModelArgs, dtype: torch.dtype, positions: int) -> int:
    """About what a model of `args` in `dtype` takes when it caches `positions`: its weights, the KV cache,
    the float32 rotary tables (max_seq_len rows of cos and sin) and `OVERHEAD`."""
    size = torch.empty(0, dtype=dtype).element_size()
    rotary = 2 * args.max_seq_len * (args.head_dim // 2) * 4
    cache = kv_cache_bytes(args, positions, bytes_per_value=size)
    return count_parameters(args).total * size + cache + rotary + OVERHEAD


def _check_memory(ns, args: ModelArgs, device: torch.device, dtype: torch.dtype, positions: int) -> None:
    """Before random weights of a catalogue shape are made: they fit, or a usage error says what would."""
    free = _available_bytes(device)
    need = _model_bytes(args, dtype, positions)
    if free is None or need <= free:
        return
    gb = lambda n: f"{n / 1e9:.1f} GB"  # noqa: E731
    name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    fixes = []
    if dtype == torch.float32 and (half := _model_bytes(args, torch.bfloat16, positions)) <= free:
        fixes.append(f"--dtype bfloat16 ({gb(half)})")
    smaller = [(m, _model_bytes(a, dtype, min(positions, a.max_seq_len))) for m, a in MODELS.items()]
    if fits := [f"{m} ({gb(n)})" for m, n in smaller if n <= free and m != ns.model]:
        fixes.append(f"a smaller --model: {', '.join(fits)}")
    size = torch.empty(0, dtype=dtype).element_size()
    if (cache := kv_cache_bytes(args, positions, bytes_per_value=size)) > 0.05 * need:
        fixes.append(f"a shorter prompt or fewer --max-new-tokens (their KV cache takes {gb(cache)})")
    raise UsageError(
        f"{ns.model} with random weights in {name(dtype)} needs about {gb(need)} on {device}, but only "
        f"{gb(free)} is available; "
        + (f"what fits: {'; '.join(fixes)}" if fixes else "no catalogue model fits; free memory or use a GPU")
    )


def _prompt_ids(ns, tokenizer) -> list[int]:
    if ns.chat:
        messages = [{"role": "system", "content": ns.system}] if ns.system else []
        return tokenizer.encode_dialog([*messages, {"role": "user", "content": ns.prompt}])
    return tokenizer.encode(ns.prompt, bos=True)


def _preflight(ns, device: torch.device, dtype: torch.dtype | None) -> None:
    """Every check that needs no weights, before any are read or made: the sampling settings, the
    checkpoint or model name, the prompt against the context, the vocabulary, the memory."""
    from .generate import context_overflow
    from .tokenizer import Tokenizer

    for bad, message in (
        (ns.max_new_tokens < 1, f"--max-new-tokens {ns.max_new_tokens} must be at least 1"),
        (ns.temperature < 0, f"--temperature {ns.temperature} must be >= 0 (0 is greedy)"),
        (not 0 < ns.top_p <= 1, f"--top-p {ns.top_p} must be in (0, 1] (1 keeps every token)"),
        (ns.top_k is not None and ns.top_k < 1, f"--top-k {ns.top_k} must be at least 1 (or left out)"),
        (ns.max_seq_len is not None and ns.max_seq_len < 1, f"--max-seq-len {ns.max_seq_len} must be at least 1"),
        (ns.system is not None and not ns.chat, "--system is a chat message: pass --chat too"),
    ):
        if bad:
            raise UsageError(message)
    if ns.checkpoint is not None:
        if message := _not_here(ns.checkpoint, "--checkpoint"):
            if not ns.checkpoint.endswith(".gguf"):
                raise UsageError(message)
        if not Path(ns.checkpoint).is_dir():
            return  # the loader reports what it is
        from .checkpoint import load_args

        args, tokenizer = load_args(ns.checkpoint), Tokenizer.default(checkpoint=ns.checkpoint)
    else:
        args, tokenizer = _model_args(ns.model), Tokenizer.default()
    longest = args.max_seq_len
    if ns.max_seq_len is not None:
        args = args.replace(max_seq_len=ns.max_seq_len)
    if args.vocab_size < tokenizer.n_words:
        raise UsageError(
            f"the model's vocab_size={args.vocab_size} is smaller than the tokenizer's {tokenizer.n_words}"
        )
    prompt = len(_prompt_ids(ns, tokenizer))
    if message := context_overflow(prompt, ns.max_new_tokens, args.max_seq_len, ("--max-new-tokens", "max_seq_len")):
        if args.max_seq_len < longest:
            message += f", or raise --max-seq-len (up to the model's {longest})"
        raise UsageError(message)
    if ns.model is not None and ns.tp is None:
        dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
        _check_memory(ns, args, device, dtype, prompt + ns.max_new_tokens - 1)


def _checkpoint_path(name: str) -> str:
    """A checkpoint argument as a path: a name of `ml.fetch` (smollm2-135m) becomes its cached GGUF file,
    fetched on first use; anything else stays as given."""
    from .fetch import SHIPPED, fetch

    if name in SHIPPED and not Path(name).exists():
        try:
            return str(fetch(name))
        except RuntimeError as error:
            raise UsageError(str(error)) from None
    return name


def _is_checkpoint(path: str) -> bool:
    """A checkpoint folder, or a single-file checkpoint (a .gguf)."""
    return Path(path).is_dir() or (Path(path).is_file() and path.lower().endswith(".gguf"))


def _generation_model(ns, device, dtype, mesh, echo):
    """The model and tokenizer `generate` runs: a checkpoint (under --tp each rank reads only its own slices)
    or random weights, quantised when asked; a vocabulary smaller than the tokenizer's is a usage error."""
    from .checkpoint import load
    from .tokenizer import Tokenizer

    if ns.checkpoint is not None:
        if not _is_checkpoint(ns.checkpoint):
            raise UsageError(f"checkpoint directory not found: {ns.checkpoint}")
        if mesh is not None:  # each rank reads only its own slices
            from .checkpoint.parallel import load_parallel

            model = load_parallel(ns.checkpoint, mesh, device=device, dtype=dtype, max_seq_len=ns.max_seq_len)
        else:
            model = load(
                ns.checkpoint, device=device, dtype=dtype, progress=not ns.quiet, max_seq_len=ns.max_seq_len
            )
        tokenizer = Tokenizer.default(checkpoint=ns.checkpoint)
    else:
        args = _model_args(ns.model)
        if ns.max_seq_len is not None:
            args = args.replace(max_seq_len=ns.max_seq_len)
        dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
        echo(
            f"{args.name}: random weights (seed {ns.seed}), not a trained model: expect gibberish",
            file=sys.stderr,
        )
        model = random_model(args, device, dtype, ns.seed)  # the same seed on every rank
        if mesh is not None:
            from .distributed import parallelize

            parallelize(model, mesh)
        tokenizer = Tokenizer.default()
    if ns.quantize is not None:
        from .quantize import quantize

        try:
            quantize(model, ns.quantize, group_size=ns.group_size if ns.quantize == "int4" else None)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if model.args.vocab_size < tokenizer.n_words:
        raise UsageError(
            f"the model's vocab_size={model.args.vocab_size} is smaller than the tokenizer's {tokenizer.n_words}"
        )
    return model, tokenizer


def _print_stream(steps, tokenizer, echo) -> list[float]:
    """Print the text as the tokens arrive (whole UTF-8 characters only); the arrival time of each token."""
    from .tokenizer import StreamDecoder

    decoder = StreamDecoder(tokenizer)
    arrivals = []
    for token in steps:
        arrivals.append(time.perf_counter())
        echo(decoder.push(token), end="", flush=True)
    echo(decoder.flush())
    return arrivals


def _timing(start: float, arrivals: list[float], prompt: int, compiled) -> list[str]:
    """The timing line's parts: the prefill (the first token's arrival), the compilation (inside the first
    decode step, with --compile) and the decode rate over the steps after it."""
    report = []
    if not arrivals:
        return report
    prefill = arrivals[0] - start
    report.append(f"prefill {prompt} tokens in {prefill * 1e3:.0f} ms ({prompt / prefill:.1f} tok/s)")
    decoded = arrivals
    if compiled is not None and compiled.compiles and len(arrivals) > 1:
        report.append(f"decode step compiled in {compiled.compile_s:.1f} s (first decode step, not counted)")
        decoded = arrivals[1:]
    if len(decoded) > 1:
        n = len(decoded) - 1
        report.append(f"decode {n} tokens at {n / (decoded[-1] - decoded[0]):.1f} tok/s")
    return report


def cmd_generate(ns) -> int:
    from .generate import generate

    if (ns.checkpoint is None) == (ns.model is None):
        raise UsageError(
            "pass exactly one of --checkpoint DIR (real weights) or --model NAME (random weights)"
        )
    if ns.checkpoint is not None:
        ns.checkpoint = _checkpoint_path(ns.checkpoint)
    if ns.compile and ns.tp is not None:
        raise UsageError(
            "--compile is not available with --tp (the compiled step is for one device); drop one"
        )
    device = _device(ns.device)
    dtype = _dtype(ns.dtype)
    _preflight(ns, device, dtype)  # bad settings, names, prompts and sizes fail here, before any weights
    mesh = _tp_mesh(ns.tp) if ns.tp is not None else None
    if mesh is not None:  # one device per rank: cuda:LOCAL_RANK (set by init), or the CPU
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if mesh.device_type == "cuda"
            else torch.device("cpu")
        )
    # under torchrun every rank runs this; only rank 0 prints
    echo = print if mesh is None or mesh.get_local_rank() == 0 else (lambda *a, **k: None)
    started = time.perf_counter()
    model, tokenizer = _generation_model(ns, device, dtype, mesh, echo)
    loaded = time.perf_counter()
    ids = _prompt_ids(ns, tokenizer)
    steps = generate(
        model,
        [ids],
        max_new_tokens=ns.max_new_tokens,
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        seed=ns.seed,
        stop_tokens=tokenizer.stop_tokens,
        stream=True,
        compile=ns.compile,
    )
    compiled = None
    if ns.compile:
        from .compiled import compile_decode

        compiled = compile_decode(model)  # the step generate uses (cached on the model)
    start = time.perf_counter()
    arrivals = _print_stream(steps, tokenizer, echo)
    weights = f"{model.tok_embeddings.weight.dtype}".replace("torch.", "")
    if ns.quantize is not None:
        weights += f", {ns.quantize}" + (f" g{ns.group_size}" if ns.quantize == "int4" else "") + " weights"
    report = [f"loaded in {loaded - started:.1f} s on {device} ({weights})"]
    report += _timing(start, arrivals, len(ids), compiled)
    if mesh is not None:
        report.append(f"tensor-parallel over {mesh.size()} ranks")
        torch.distributed.destroy_process_group()
    echo("; ".join(report), file=sys.stderr)
    return 0


def _tp_mesh(degree: int):
    """The tensor-parallel mesh under torchrun (`minillama.distributed.init`); bad launches are usage errors."""
    from .distributed import init

    try:
        return init(degree)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _served_name(checkpoint: str) -> str:
    """The model id a server answers to: a checkpoint folder's name, a .gguf file's without the suffix,
    or the fetched name as given (smollm2-135m)."""
    name = Path(checkpoint.rstrip("/")).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def cmd_serve(ns) -> int:
    """`serve`: the model behind an OpenAI-compatible HTTP server on the continuous-batching engine
    (chapter 12, `minillama.serving.server`); runs until Ctrl-C."""
    if (ns.checkpoint is None) == (ns.model is None):
        raise UsageError(
            "pass exactly one of --checkpoint DIR (real weights) or --model NAME (random weights)"
        )
    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port {ns.port} is not a TCP port (0..65535)")
    try:
        from .serving import Engine
        from .serving.server import serve
    except ImportError as error:
        raise UsageError(
            f"{error} (the server is the `serve` extra: pip install 'minillama[serve]')"
        ) from None
    name = ns.served_model_name or ns.model or _served_name(ns.checkpoint)
    if ns.checkpoint is not None:
        ns.checkpoint = _checkpoint_path(ns.checkpoint)
    model, tokenizer = _generation_model(ns, _device(ns.device), _dtype(ns.dtype), None, print)
    engine = Engine(
        model, tokenizer, block_size=ns.block_size, num_blocks=ns.num_blocks, max_batch=ns.max_batch
    )
    print(f"serving {name!r} on http://{ns.host}:{ns.port}/v1 ({engine.num_blocks} KV blocks of "
          f"{engine.block_size} positions, at most {ns.max_batch} sequences per step)", file=sys.stderr)  # fmt: skip
    try:
        serve(engine, tokenizer, name, host=ns.host, port=ns.port, log_level=ns.log_level)
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on: a clean stop
        pass
    return 0


def shape_of(name: str, option: str = "MODEL") -> ModelArgs:
    """The `ModelArgs` of a catalogue name or a checkpoint folder's config (`count`, `card --model`); anything
    else is a usage error naming the problem: a missing folder, a file, a hub id, a near-miss name."""
    if name in MODELS:
        return MODELS[name]
    if _is_checkpoint(str(Path(name).expanduser())):
        from .checkpoint import load_args

        return load_args(Path(name).expanduser())
    if message := _not_here(name, option):
        raise UsageError(message)
    if os.sep in name or name.startswith((".", "~")):
        raise UsageError(f"no such checkpoint folder: {name} ({option} is a catalogue name or a checkpoint folder)")
    raise UsageError(f"{unknown_model(name, MODELS)} (or a checkpoint folder or .gguf file)")


def cmd_count(ns) -> int:
    if ns.checkpoint is None and ns.model is None:
        raise UsageError(f"the following arguments are required: MODEL (or --checkpoint PATH) (see {PROG} count --help)")
    if ns.checkpoint is not None and ns.model is not None:
        raise UsageError("pass MODEL or --checkpoint PATH, not both")
    if ns.checkpoint is not None:
        ns.model = _checkpoint_path(ns.checkpoint)
    args = shape_of(ns.model)
    rows = [(name, calc, f"{n:,}") for name, calc, n in count_parameters(args).table()]
    header = ("component", "calculation", "parameters")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    print(f"{args.name}: parameters")
    for i, (name, calc, n) in enumerate([header, *rows]):
        if i == len(rows):  # before the total
            print("-" * (sum(widths) + 4))
        print(f"{name:<{widths[0]}}  {calc:<{widths[1]}}  {n:>{widths[2]}}".rstrip())
    return 0


def _delegate(module: str, function: str, what: str, argv: list[str]) -> int:
    if importlib.util.find_spec(f"minillama.{module}") is None:
        raise UsageError(f"`{what}` is not available in this version of minillama (no minillama.{module})")
    target = getattr(importlib.import_module(f"minillama.{module}"), function, None)
    if target is None:
        raise UsageError(f"`{what}` is not available: minillama.{module} has no {function}()")
    return target(argv) or 0


# commands whose module parses its own arguments: (module, function, help)
DELEGATED = {
    "card": (
        "cards",
        "main_card",
        "print a component or tensor card (COMPONENT --model M --mode decode --positions P)",
    ),
    "bench": ("bench", "main", "decode/prefill throughput and achieved bandwidth"),
}


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog=PROG,
        description="minillama: Llama 3.1 from the inside. Generate text, count parameters, print cards, benchmark.",
        epilog=f"Run `{PROG} COMMAND --help` for a command's options.",
        formatter_class=_Help,
    )
    top.add_argument(
        "--version", action="version", version=f"minillama {__version__} (torch {torch.__version__})"
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    g = sub.add_parser(
        "generate",
        help="stream a continuation of a prompt (or a chat reply), then report tok/s on stderr",
        description="Stream text from a checkpoint (Meta, Hugging Face or GGUF), or from a model of a named "
        "shape with random weights. Timings go to stderr: load, prefill, decode tok/s.",
        formatter_class=_Help,
    )
    src = g.add_argument_group("weights (one of)")
    src.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a Meta (params.json + consolidated.*.pth) or Hugging Face "
        "(config.json + *.safetensors) checkpoint directory (its tokenizer.model if present), a .gguf file "
        "(its own tokenizer and chat template), or smollm2-135m (fetched once, see ml.fetch)",
    )
    src.add_argument(
        "--model", metavar="NAME", help=f"random weights of a catalogue shape: {', '.join(MODELS)}"
    )
    g.add_argument("--prompt", required=True, help="the prompt text (encoded after <|begin_of_text|>)")
    g.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as a user message in the checkpoint's chat format (Llama 3.1's, or a GGUF's "
        "template) and stop at the end of the turn",
    )
    g.add_argument("--system", help="with --chat: a system message before the user's")
    g.add_argument(
        "--max-new-tokens", type=int, default=128, metavar="N", help="most tokens to generate"
    )
    g.add_argument(
        "--temperature", type=float, default=0.6, metavar="T", help="0 is greedy (the default is Meta's)"
    )
    g.add_argument(
        "--top-p",
        type=float,
        default=0.9,
        metavar="P",
        help="nucleus: keep the most likely tokens up to this mass (1 keeps all; the default is Meta's)",
    )
    g.add_argument("--top-k", type=int, default=None, metavar="K", help="keep only the K most likely tokens")
    g.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the sampler (and of random weights)"
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps; auto: cuda if available, else cpu")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="weights dtype; auto: the checkpoint's, and for random weights float32 on a CPU, else bfloat16",
    )
    g.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        metavar="N",
        help="cap the context (rotary tables, largest cache) (default: the config's)",
    )
    g.add_argument(
        "--quantize",
        choices=("int8", "int4"),
        default=None,
        help="weight-only quantisation after loading (chapter 9): int8 per channel, int4 per group",
    )
    g.add_argument(
        "--group-size",
        type=int,
        default=128,
        choices=(32, 64, 128, 256),
        metavar="G",
        help="with --quantize int4: inputs per scale and zero (32, 64, 128 or 256)",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="decode with the compiled step (ml.compile_decode; on a CPU frozen weights with Inductor's C++ "
        "GEMM template or oneDNN, chapter 8): the first decode step compiles, the timing line reports it apart",
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar while loading")
    g.add_argument(
        "--tp",
        type=int,
        default=None,
        metavar="N",
        help="tensor-parallel over N ranks; launch with `torchrun --nproc-per-node N -m minillama generate ... --tp N`",
    )
    g.set_defaults(run=cmd_generate)

    c = sub.add_parser(
        "count",
        help="the parameter accounting table of a model",
        description="Exact parameter counts per component, from the config alone (no weights).",
        formatter_class=_Help,
    )
    c.add_argument(
        "model", metavar="MODEL", nargs="?", help=f"one of {', '.join(MODELS)}, or a checkpoint directory"
    )
    c.add_argument("--checkpoint", metavar="PATH", help="a checkpoint directory, a .gguf file or smollm2-135m")
    c.set_defaults(run=cmd_count)

    v = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) on the batching engine",
        description="Serve a checkpoint, or random weights of a named shape, over OpenAI's HTTP API; every "
        "request joins the engine's continuous batch. Needs the `serve` extra: pip install 'minillama[serve]'.",
    )
    src = v.add_argument_group("weights (one of)")
    src.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="a Meta or Hugging Face checkpoint directory, a .gguf file, or smollm2-135m (fetched once)",
    )
    src.add_argument(
        "--model", metavar="NAME", help=f"random weights of a catalogue shape: {', '.join(MODELS)}"
    )
    v.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    v.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    v.add_argument(
        "--served-model-name", metavar="NAME", help="the model id clients send (default: from the weights)"
    )
    v.add_argument(
        "--max-batch", type=int, default=32, metavar="N", help="most sequences per engine step (32)"
    )
    v.add_argument(
        "--num-blocks", type=int, default=None, metavar="N", help="KV-cache blocks (default: the engine's)"
    )
    v.add_argument(
        "--block-size", type=int, default=16, metavar="N", help="positions per KV-cache block (16)"
    )
    v.add_argument(
        "--max-seq-len", type=int, default=None, metavar="N", help="cap the context (default: the config's)"
    )
    v.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps (default: cuda if available)")
    v.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights dtype (default: the checkpoint's; random weights: float32 on CPU, else bfloat16)")  # fmt: skip
    v.add_argument("--seed", type=int, default=0, metavar="S", help="seed of random weights")
    v.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    v.set_defaults(run=cmd_serve, quiet=False, quantize=None, group_size=None)

    for name, (_module, _function, text) in DELEGATED.items():
        p = sub.add_parser(name, help=text, add_help=False, description=text)
        p.add_argument(
            "rest", nargs=argparse.REMAINDER, help=f"arguments of `{name}` (see `{PROG} {name} --help`)"
        )
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    try:
        if argv and argv[0] in DELEGATED:  # their own parser sees every argument, --help included
            return _delegate(*DELEGATED[argv[0]][:2], argv[0], argv[1:])
        ns = p.parse_args(argv)
        if ns.command is None:
            p.print_help()
            return 2
        return ns.run(ns)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except (
        ValueError,
        FileNotFoundError,
    ) as error:  # a bad checkpoint, prompt or setting: say what, no traceback
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
