"""Peak host memory of `minillama.load` against the size of the checkpoint it reads.

Writes a bfloat16 checkpoint of about 1 GB (random weights) in Hugging Face and Meta layouts, then loads
each in a fresh process and reports the growth of peak RSS (ru_maxrss) over the process's RSS before
`load`, divided by the file size and by the size of the loaded weights. A forward pass after loading
touches every weight, so memory-mapped weights are counted too. A ratio near 1 means one copy.
Model-parallel shards are merged one shard at a time: the peak is the weights plus one shard.

    python benchmarks/load_memory.py [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# about 490M parameters: 0.98 GB in bfloat16
ARGS = {
    "dim": 2048,
    "n_layers": 8,
    "n_heads": 16,
    "n_kv_heads": 4,
    "vocab_size": 32_000,
    "multiple_of": 256,
    "max_seq_len": 4096,
}


def write(out: Path) -> None:
    import torch

    import minillama as ml

    args = ml.ModelArgs(**ARGS, name="load-memory")
    with torch.device("meta"):
        model = ml.Transformer(args)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    ml.save(model, out / "hf")
    state = model.state_dict()
    params = {k: v for k, v in ARGS.items() if k != "max_seq_len"} | {
        "ffn_dim_multiplier": args.ffn_dim_multiplier
    }
    for name, shards in (("meta", 1), ("meta2", 2)):
        (out / name).mkdir()
        (out / name / "params.json").write_text(json.dumps(params))
        for r in range(shards):
            shard = {}
            for key, w in state.items():
                dim = 1 if key.endswith(("attention.wo.weight", "feed_forward.w2.weight")) else 0
                shard[key] = w if shards == 1 or "norm" in key else w.chunk(shards, dim=dim)[r].clone()
            torch.save(shard, out / name / f"consolidated.{r:02d}.pth")


def measure(path: Path, dtype: str) -> dict:
    import torch

    import minillama as ml

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    before = rss()
    model = ml.load(path, dtype=None if dtype == "none" else dtype, progress=False)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # touches every weight
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    files = sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".pth"))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"file_bytes": files, "weight_bytes": weights, "peak_growth_at_load": loaded - before,
            "peak_growth": peak - before}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    parser.add_argument("--_write", help=argparse.SUPPRESS)
    parser.add_argument("--_measure", nargs=2, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns._write:
        write(Path(ns._write))
        return 0
    if ns._measure:
        print(json.dumps(measure(Path(ns._measure[0]), ns._measure[1])))
        return 0
    out = Path(ns.dir or tempfile.mkdtemp(prefix="minillama-load-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, __file__, "--_write", str(out)], check=True)
        print(
            f"{'layout':<28} {'file GB':>8} {'weights GB':>10} {'peak RSS growth GB':>19} {'/ file':>7} {'/ weights':>9}"
        )
        for name, dtype, label in (
            ("hf", "none", "HF safetensors, bf16"),
            ("meta", "none", "Meta 1 shard, bf16"),
            ("meta2", "none", "Meta 2 shards, bf16"),
            ("hf", "float32", "HF safetensors -> float32"),
        ):
            result = subprocess.run(
                [sys.executable, __file__, "--_measure", str(out / name), dtype],
                check=True,
                capture_output=True,
                text=True,
            )
            r = json.loads(result.stdout)
            print(f"{label:<28} {r['file_bytes'] / 1e9:>8.3f} {r['weight_bytes'] / 1e9:>10.3f} "
                  f"{r['peak_growth'] / 1e9:>19.3f} {r['peak_growth'] / r['file_bytes']:>7.2f} "
                  f"{r['peak_growth'] / r['weight_bytes']:>9.2f}")  # fmt: skip
    finally:
        if not ns.keep:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
