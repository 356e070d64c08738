#!/usr/bin/env bash
# The checks a GPU session runs, as one prepared command on the device machine (about 9 minutes; each step has its
# own time limit, so the ones that finish come back even when a later one runs out):
#   1. the GPU's name and memory (every number below is recorded with it);
#   2. the offloaded_static failure left open (self_extend and dca, eager and SDPA), with its whole traceback;
#   3. the CUDA tests: tests/test_remapped_cuda.py and the CUDA-only cache tests (offloaded caches);
#   4. bench_attention on the Qwen2.5-0.5B shape and the gemma3-270m hybrid (their --write sections: $OUT/BENCHMARKS.md).
# Everything goes to $OUT (the run tool brings it back). On this machine first: bash scripts/gpu_wheels.sh, then
#     run(command="bash scripts/gpu_checks.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
OUT="${OUT:-runs/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if [ -d .whl ]; then
  "$PY" -m pip install --disable-pip-version-check -q --no-index --no-deps --target /tmp/site .whl/*.whl \
    > "$OUT/install.log" 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
step() {  # step LOG SECONDS COMMAND...: its output added to $OUT/LOG.log, its status to $OUT/steps.txt
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >> "$OUT/$name.log" 2>&1
  echo "$name: $* -> rc=$? seconds=$((SECONDS - start))" | tee -a "$OUT/steps.txt"
}
step machine 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step machine 60 "$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
step offloaded_static 120 "$PY" -m pytest -x --tb=long -q -p no:cacheprovider \
  "tests/test_cache_matrix.py::test_cached_generate_equals_recomputation[self_extend-offloaded_static-sdpa]"
step cuda_tests 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_remapped_cuda.py tests/test_cache_matrix.py -k "cuda or offloaded"
step bench 120 "$PY" scripts/bench_attention.py --device cuda --lengths 16384,32768 --rounds 2 --memory-length 0 --write
step bench 90 "$PY" scripts/bench_attention.py --device cuda --geometry gemma3-270m --lengths 8192,16384,32768 \
  --rounds 1 --memory-length 0 --write
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"  # (the run tool returns at most 8 files: 7 here)
