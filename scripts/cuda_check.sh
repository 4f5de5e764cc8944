#!/usr/bin/env bash
# The learner on CUDA, in one go: its tests, its update benchmark (CUDA beside the same
# machine's CPU, three batch sizes) and a short `fast train` whose learner picks the GPU.
# For a machine with a GPU whose Python already has torch; the project's other packages
# come from PYTHONPATH (the lent device machine: docs/learner.md "On CUDA" says how).
#
#   bash scripts/cuda_check.sh OUTDIR
#
# Writes OUTDIR/device.txt, tests.log, update.log, train.log and metrics.jsonl; exits non-zero when a step failed.
set -uo pipefail
out=${1:?usage: bash scripts/cuda_check.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
    echo "scripts/cuda_check.sh: python3 here has no torch that sees a CUDA device; run it on a GPU machine with a python3 that has torch" >&2
    exit 2
fi
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
    2>&1 | tee "$out/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$out/device.txt"

echo "== learner tests on CUDA"
timeout 360 python3 -m pytest -q -p no:cacheprovider -n 8 \
    tests/test_ppo.py tests/test_smpo.py tests/test_gae.py tests/test_learner_hyperparameters.py \
    tests/test_learner_validation.py tests/test_learning_levers.py tests/test_learner_service.py \
    tests/test_distributed_learner.py tests/test_learner_ranks.py tests/test_policy_runner.py \
    2>&1 | tee "$out/tests.log" || status=1

echo "== update benchmark"
for shape in "256 10" "256 64" "512 256"; do
    set -- $shape
    for device in cuda cpu; do
        echo "-- device $device, batch [$1, $2]"
        timeout 120 python3 -m benchmarks.learner_update --device "$device" --steps "$1" --slots "$2" --repeats 7 || status=1
    done
done 2>&1 | tee "$out/update.log"

echo "== fast train, 30 iterations, learner on the GPU"
timeout 240 python3 -m fast train --iterations 30 --eval-episodes-per-clip 1 --no-gateway \
    --runs-dir /tmp/cuda-check-runs --name cuda 2>&1 | tee "$out/train.log" || status=1
cp /tmp/cuda-check-runs/cuda/metrics.jsonl "$out/" 2>/dev/null
grep -rho 'device=[a-z0-9:]*' /tmp/cuda-check-runs/cuda 2>/dev/null | sort | uniq -c | tee -a "$out/train.log"
exit $status
