#!/usr/bin/env bash
# The CPU measurement committed for chapters 7 and 8: the tiny model (random weights, seeded) in float32,
# prompt 32 + 64 new tokens, every CPU variant and Hugging Face's on the same weights, in two parts merged
# into one JSON that names the machine (about 8 minutes on 2 cores: 471 s the last time; run it on an
# otherwise idle machine: a second busy process changes every figure):
#   1  batch 1, 15 repeats: the headline ratios (ml.generate / HF generate, decode step / matvec)
#   2  batch 2, 4, 8, 16, 7 repeats: the batch sweep
#
#   bash benchmarks/cpu.sh                  # results in benchmarks/results/<machine>-<date>.json (published:
#                                           # the book renders it; a same-day rerun adds -2, never replaces)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VARIANTS=eager,static,compile,compile-prefill,generate,hf,hf-static,hf-compile
PARTS=$(mktemp -d)
trap 'rm -rf "$PARTS"' EXIT
"$PY" -m minillama bench --model tiny --dtype float32 --prompt-len 32 --new-tokens 64 --device cpu --seed 0 \
  --batch 1 --repeats 15 --variants "$VARIANTS" --json "$PARTS/1.json"
"$PY" -m minillama bench --model tiny --dtype float32 --prompt-len 32 --new-tokens 64 --device cpu --seed 0 \
  --batch 2,4,8,16 --repeats 7 --variants "$VARIANTS" --json "$PARTS/2.json"
"$PY" - "$PARTS" <<'PYEOF'
import json, sys
from minillama import bench
parts = [json.load(open(f"{sys.argv[1]}/{i}.json")) for i in (1, 2)]
merged = bench.merge_results(parts)
path = bench.save_results(merged, publish=True)
print(bench.table(merged))
print("results:", path)
PYEOF
echo "total ${SECONDS}s"
