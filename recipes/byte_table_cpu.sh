#!/usr/bin/env bash
# The CPU-sized byte comparison of the search over forms against the uniform forms, greedy, random and QAT:
# PatchTST d_model 128 (--size medium: 8 heads, 2 layers, FFN 256), a week of context, a day ahead, patches of a day,
# 2,000 steps of batch 64 over every window (batch 16 for the four channels of Appliances Energy); electricity, bike
# rentals (the count alone) and Appliances Energy; 3 seeds; every arm at budget 1/16 of every Linear's fp32 bytes.
# One thread a process (OMP_NUM_THREADS=1: threads that wait on a shared CPU burn it); the three data sets are three
# processes, run one after another (on 2 free cores, run two at once).
#
#     bash recipes/byte_table_cpu.sh [OUTPUT_DIR] [SEEDS...]
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-byte-table-cpu}
shift || true
seeds=("${@:-0 1 2}")
export OMP_NUM_THREADS=1
python=${PYTHON:-python}

common=(--device cpu --size medium --context 168 --horizon 24 --patch 24 24 --learning-rate 1e-3 --steps 2000
        --train-stride 1 --random-draws 1 --budget-ratio 1/16 --forms dense lowbit svd cp biprop
        --factor-widths 4 2 ternary --weight-group-sizes 32 row --keep-ratios 0.5 --max-candidates 4
        --search-schedule 4 2 3 --byte-reward validation_loss --seeds ${seeds[*]})
runs=(dense ptq-int8-all ptq-int4-all qat-int4-all qat-int2-all qat-ternary-all lowbit-2-g128 lowbit-ternary-g128
      smartformer-bytes uniform-lowbit-bytes uniform-svd-bytes uniform-biprop-bytes random-bytes greedy-bytes)

"$python" byte_comparison.py "${common[@]}" --runs "${runs[@]}" --datasets electricity --batch-size 64 \
    --output-dir "$out/electricity"
"$python" byte_comparison.py "${common[@]}" --runs "${runs[@]}" --datasets bikesharing --batch-size 64 \
    --output-dir "$out/bikesharing" --data --target count --drop-columns date tmin tmax pn
"$python" byte_comparison.py "${common[@]}" --runs "${runs[@]}" --datasets appliances_energy --batch-size 16 \
    --output-dir "$out/appliances_energy" --data --target Appliances T1 RH_1 T_out
"$python" byte_comparison.py --merge "$out/electricity" "$out/bikesharing" "$out/appliances_energy" \
    --datasets electricity bikesharing appliances_energy --budget-ratio 1/16 --output-dir "$out"
