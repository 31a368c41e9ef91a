#!/usr/bin/env bash
# The whole GPU measurement of chapters 7 and 8, in one go, in at most ~10 minutes on one H200:
# the 8B-shaped model (random weights, seeded) in bfloat16, prompt 128 + 128 new tokens, measured by
# `python -m minillama.bench` in parts, each its own process under its own time limit (a compile that
# hangs costs only its part), most important first, then merged into one JSON that names the GPU:
#   A  batch 1: eager, static, ml.generate, HF generate (dynamic cache); copy bandwidth, bf16 matmul rate
#   B  torch.compile(decode_one_token, mode="reduce-overhead"), CUDA graphs, at batch 1 and the sweep
#      2, 4, ..., 64 (two compilations: batch 1, then one graph for every larger batch)
#   C  batch 1: HF static cache + torch.compile (transformers' own compile_config, reduce-overhead)
#   E  batch 1: torch.compile mode "default" (no CUDA graphs), the waterfall's middle step
#   Q  batch 1: weight-only quantised copies (chapter 9): int8, int4 g128, each eager and compiled, and
#      torchao's int8/int4 when torchao is installed, beside bf16 static; written apart from the merged
#      file (quantised/), so chapters 7-8 read only A-E
#   S  chapter 12's serving workload (benchmarks/serving.py): seeded Poisson arrivals, static batching with
#      ml.generate, the engine, the engine with prefix sharing, transformers' continuous batching, wall
#      clock; written apart too (serving/)
# Every part measures the ceilings again (a few seconds); the seed makes the weights the same in all.
# Installs nothing from the internet: it uses whichever python has torch with CUDA, installs this
# checkout with `pip install -e . --no-deps` (falling back to PYTHONPATH), and takes missing pure-python
# dependencies from benchmarks/wheels/ when that folder exists.
#
#   bash benchmarks/gpu_h200.sh            # results in $OUT (when set) or benchmarks/results/
#   BUDGET=400 bash benchmarks/gpu_h200.sh # a tighter overall limit in seconds (default 570)
#   ONLY=Q bash benchmarks/gpu_h200.sh     # only the named parts (comma-separated), e.g. the quantised one
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET=${BUDGET:-570}
MODEL=${MODEL:-llama-3.1-8b}
# DEVICE=cpu MODEL=tiny DTYPE=float32 PROMPT_LEN=8 NEW_TOKENS=4: a smoke test of this script on a CPU
DEVICE=${DEVICE:-cuda}
COMMON=(--model "$MODEL" --dtype "${DTYPE:-bfloat16}" --prompt-len "${PROMPT_LEN:-128}"
        --new-tokens "${NEW_TOKENS:-128}" --device "$DEVICE" --seed 0)
DEST=${OUT:-benchmarks/results}
PARTS=$DEST/gpu-parts
mkdir -p "$PARTS"

PY=
for candidate in "${PYTHON:-}" python3 python .venv/bin/python; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c "import sys, torch; sys.exit(0 if '$DEVICE' == 'cpu' or torch.cuda.is_available() else 1)" \
      2>/dev/null; then
    PY=$candidate
    break
  fi
done
if [ -z "$PY" ]; then
  echo "no python with a CUDA-enabled torch found (set PYTHON=...)" >&2
  exit 1
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true

missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("einops", "safetensors", "tiktoken", "tqdm", "transformers") if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ] && [ -d benchmarks/wheels ]; then
  "$PY" -m pip install -q --no-index --find-links benchmarks/wheels $missing || true
fi
"$PY" -m pip install -q -e . --no-deps --no-build-isolation 2>/dev/null || echo "(pip install -e . failed: using PYTHONPATH)"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! "$PY" -c "import minillama.bench" 2>"$PARTS/import.log"; then
  echo "minillama does not import here: $(tail -1 "$PARTS/import.log"); missing modules: ${missing:-none}" >&2
  exit 1
fi
HF=1
"$PY" -c "import transformers" 2>/dev/null || { HF=0; echo "transformers is not installed: the HF parts are skipped"; }

# part NAME PLANNED_SECONDS ARGS...: runs under min(planned, what is left of the budget)
part() {
  local name=$1 planned=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then
    return
  fi
  local left=$((BUDGET - SECONDS - 15))
  local limit=$((planned < left ? planned : left))
  if [ "$limit" -lt 90 ]; then
    echo "part $name skipped: ${left}s left of the ${BUDGET}s budget"
    return
  fi
  echo "part $name: up to ${limit}s (${SECONDS}s used)"
  # the warm-up (compile) limit leaves a minute of the part for building the model and the timed repeats
  timeout -k 10 "$limit" "$PY" -m minillama.bench "${COMMON[@]}" "$@" --timeout $((limit - 60)) \
    --json "$PARTS/$name.json" >"$PARTS/$name.out" 2>"$PARTS/$name.log"
  local rc=$?
  if [ $rc -eq 0 ]; then
    cat "$PARTS/$name.out"
  else
    echo "part $name ended with exit status $rc (124: time limit); the end of its log:"
    tail -n 15 "$PARTS/$name.log"
  fi
}

part A 160 --batch 1 --repeats 3 --variants eager,static,generate$([ $HF = 1 ] && echo ,hf)
part B 250 --batch 1,2,4,8,16,32,64 --repeats 3 --variants compile-reduce-overhead
[ $HF = 1 ] && part C 150 --batch 1 --repeats 5 --variants hf-compile
part E 150 --batch 1 --repeats 5 --variants compile
AO=1
"$PY" -c "import torchao" 2>/dev/null || { AO=0; echo "torchao is not installed: part Q runs without its variants"; }
part Q 200 --batch 1 --repeats 3 \
  --variants static,int8,int8-compile,int4-g128,int4-g128-compile$([ $AO = 1 ] && echo ,torchao-int8,torchao-int4-g128)
if [ -f "$PARTS/Q.json" ]; then
  mkdir -p "$DEST/quantised"
  cp "$PARTS/Q.json" "$DEST/quantised/$(date -u +%F)-gpu.json"
fi

if [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",S,"* ]]; then
  left=$((BUDGET - SECONDS - 15))
  limit=$((150 < left ? 150 : left))
  if [ "$limit" -lt 90 ]; then
    echo "part S skipped: ${left}s left of the ${BUDGET}s budget"
  else
    echo "part S: up to ${limit}s (${SECONDS}s used)"
    mkdir -p "$DEST/serving"
    timeout -k 10 "$limit" "$PY" benchmarks/serving.py --models "${MODEL}-shaped" --device "$DEVICE" \
      --dtype "${DTYPE:-bfloat16}" --wall --threads "$(nproc)" $([ $HF = 1 ] || echo --no-hf) \
      --out "$DEST/serving/$(date -u +%F)-gpu.json" >"$PARTS/S.out" 2>"$PARTS/S.log" \
      && tail -n 12 "$PARTS/S.out" || { echo "part S failed; the end of its log:"; tail -n 15 "$PARTS/S.log"; }
  fi
fi

"$PY" - "$PARTS" "$DEST" <<'EOF'
import glob, json, sys
from minillama import bench
parts_dir, dest = sys.argv[1:]
parts = [json.load(open(p)) for p in sorted(glob.glob(f"{parts_dir}/[A-E].json"))]
if not parts:  # (ONLY=Q or S: the quantised and serving parts are saved on their own)
    sys.exit(0 if glob.glob(f"{parts_dir}/Q.json") or glob.glob(f"{parts_dir}/S.out") else "no part finished: nothing to merge")
merged = bench.merge_results(parts)
path = bench.save_results(merged, f"{dest}/{merged['machine']['slug']}-{merged['machine']['date']}.json")
print(bench.table(merged))
print("results:", path)
EOF
echo "total ${SECONDS}s"
