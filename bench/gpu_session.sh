#!/usr/bin/env bash
# The one prepared GPU session of issue 26 (about 12 minutes of an H200): the decode benchmark (about 5 minutes,
# bench/gpu.py), then the demo model's training with generated tools (about 7 minutes), everything under $OUT as
# it goes (the benchmark's JSON after every measurement, training state every 200 steps, the exported artifact).
# Installs nothing.  Run from the repository root, as two commands (a device command may run 10 minutes at most):
#
#     OUT=/path/to/out bash bench/gpu_session.sh bench     # graphed-decode GPU test + benchmark, ~5 minutes
#     OUT=/path/to/out bash bench/gpu_session.sh train     # demo-model training with generated tools, ~7.5 minutes
#     DEVICE=cpu TINY=1 OUT=/tmp/out bash bench/gpu_session.sh    # a dry run of both on a CPU (minutes)
#
# Afterwards, on any machine: copy $OUT/demo-llama4.pt to workbench/demo/weights/demo-llama4.pt and run
#     python -m workbench.evals --tools unseen --cases 150   and   python -m workbench.evals --cases 150
set -euo pipefail
STAGE=${1:-all}
OUT=${OUT:-out}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
PY=${PYTHON:-python}

if [[ -n "${TINY:-}" ]]; then
    BENCH=(--device "$DEVICE" --tiny --batches 1,8 --max-minutes 3)
    TRAIN=(--steps 3 --batch-size 4 --workers 2 --vocab-sample 20 --save-every 1 --export-sample 4
           --params "$OUT/tiny-params.json")
    "$PY" -c "import json; from workbench.training.train import DEMO_PARAMS as p; \
json.dump({**p, 'dim': 64, 'n_layers': 2, 'n_heads': 2, 'n_kv_heads': 1, 'head_dim': 32}, open('$OUT/tiny-params.json', 'w'))"
    INIT=()
else
    BENCH=(--device "$DEVICE" --max-minutes 4.5)
    # warm-started from the shipped weights (their vocabulary grows by the generated tools' tokens);
    # --max-minutes saves, stops and exports within the lease even if a step is slower than the 0.1 s planned
    TRAIN=(--steps 3500 --batch-size 64 --workers 14 --save-every 200 --max-minutes 6.5 --lr 2e-3 --warmup 100)
    INIT=(--init-from workbench/demo/weights/demo-llama4.pt)
fi

if [[ "$STAGE" == all || "$STAGE" == bench ]]; then
    # graphed decode gives the eager tokens on the GPU (a minute; skipped where pytest is not installed)
    if [[ "$DEVICE" == cuda ]] && "$PY" -c "import pytest" 2>/dev/null; then
        timeout 150 "$PY" -m pytest -q -x tests/test_cuda_graphs.py -p no:cacheprovider 2>&1 \
            | tee "$OUT/graphs-test.log" || true
    fi
    "$PY" bench/gpu.py "${BENCH[@]}" --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
fi

if [[ "$STAGE" == all || "$STAGE" == train ]]; then
    "$PY" -m workbench.training.train --out "$OUT/demo-train" --device "$DEVICE" "${INIT[@]}" "${TRAIN[@]}" \
        --spelled --shared-tools --copy-exercise --composed 0.7 --synthetic 0.6 --aux-weight 0.2 --spell 0.2 \
        --generated-tools 0.5 --export "$OUT/demo-llama4.pt" 2>&1 | tee "$OUT/train.log"
fi
ls -la "$OUT"
