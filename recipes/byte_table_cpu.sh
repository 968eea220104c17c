#!/usr/bin/env bash
# The CPU-sized byte comparison of the search over forms against the uniform forms, greedy, random and QAT:
# PatchTST d_model 128 (--size medium: 8 heads, 2 layers, FFN 256), a week of context, a day ahead, patches of a day,
# 2,000 steps of batch 64 over every window (batch 16 for the four channels of Appliances Energy); electricity, bike
# rentals (the count alone) and Appliances Energy; 3 seeds; every arm at budget 1/16 of every Linear's fp32 bytes.
# Every (data set, seed) is its own process with one thread (OMP_NUM_THREADS=1: threads that wait on a shared CPU
# burn it), writing <OUTPUT_DIR>/<data set>-seed<S>/; JOBS of them run at once (JOBS=2 on 2 free cores), a finished
# one is kept when the run is stopped and skipped when it is started again, and the last step merges them all.
#
# RUNS replaces the arms and FLAGS adds the byte search's flags, e.g. the search on each Linear's Pareto front beside
# dense and greedy: RUNS="dense smartformer-bytes greedy-bytes" FLAGS=--front-only. BUDGET replaces the budget (1/32),
# DATASETS the data sets: names of the three, or paths of your own CSV files (batch 64, every column read as the
# recipe reads it, e.g. a timestamp column and one target; each file's runs go to a folder named after it). CHOOSE
# names two or more of the arms, and the table adds chosen-on-validation: per seed, whichever of them validated best
# (CHOOSE="ends-8-4 smartformer-bytes", the choice a user makes between the two trained models). LRS sweeps learning
# rates: every arm of every (data set, seed) trains at each (a process and folder each), and the table keeps, per arm
# and seed, the rate of least validation MSE (LRS="1e-3 2e-3 4e-3": every arm tuned alike, the test windows unseen).
#
#     JOBS=2 bash recipes/byte_table_cpu.sh [OUTPUT_DIR] [SEEDS...]
set -euo pipefail
source "$(dirname "$0")/byte_table_args.sh" "electricity bikesharing appliances_energy" byte-table-cpu "$@"
jobs=${JOBS:-1}
budget=${BUDGET:-1/16}
export OMP_NUM_THREADS=1
python=${PYTHON:-python}

common=(--device cpu --size medium --context 168 --horizon 24 --patch 24 24 --learning-rate 1e-3 --steps 2000
        --train-stride 1 --random-draws 1 --budget-ratio "$budget" --forms dense lowbit svd cp biprop
        --factor-widths 4 2 ternary --weight-group-sizes 32 row --keep-ratios 0.5 --max-candidates 4
        --search-schedule 4 2 3 --byte-reward validation_loss)
runs=(${RUNS:-dense ptq-int8-all ptq-int4-all qat-int4-all qat-int2-all qat-ternary-all lowbit-2-g128
      lowbit-ternary-g128 smartformer-bytes uniform-lowbit-bytes uniform-svd-bytes uniform-biprop-bytes random-bytes
      greedy-bytes})
flags=(${FLAGS:-})
choose=(${CHOOSE:+--choose-on-validation $CHOOSE})
rates=(${LRS:-""})  # one empty rate: the recipe's own

data_flags() {  # what each data set reads: its batch and, for the CSVs, the columns
    case $1 in
        electricity) echo --batch-size 64 ;;
        bikesharing) echo --batch-size 64 --data --target count --drop-columns date tmin tmax pn ;;
        appliances_energy) echo --batch-size 16 --data --target Appliances T1 RH_1 T_out ;;
        *) echo --batch-size 64 ;;
    esac
}

folder_of() {  # a data set's, seed's and learning rate's folder
    echo "$out/$(label "$1")-seed$2${3:+-lr$3}"
}

one() {  # one data set, seed and rate, unless an earlier run finished it (its comparison.json is written last)
    local folder
    folder=$(folder_of "$@")
    [[ -f "$folder/comparison.json" ]] && return 0
    # --data passes the rest of the line to the recipe: the data flags come last
    "$python" byte_comparison.py "${common[@]}" "${flags[@]}" ${3:+--learning-rate $3} --runs "${runs[@]}" \
        "${choose[@]}" --datasets "$1" --seeds "$2" --output-dir "$folder" $(data_flags "$1") > "$folder.log" 2>&1
}

mkdir -p "$out"
failed=0
for seed in "${seeds[@]}"; do
    for dataset in "${datasets[@]}"; do
        for rate in "${rates[@]}"; do
            while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || failed=1; done
            echo "$(date +%T) $dataset seed $seed${rate:+ learning rate $rate}" \
                "→ $(folder_of "$dataset" "$seed" "$rate").log"
            one "$dataset" "$seed" "$rate" &
        done
    done
done
while (( $(jobs -rp | wc -l) > 0 )); do wait -n || failed=1; done
if (( failed )); then
    echo "byte_table_cpu.sh: a run failed (its log is $out/<data set>-seed<S>.log); finished runs are kept" >&2
    exit 1
fi
folders=()
for seed in "${seeds[@]}"; do
    for dataset in "${datasets[@]}"; do
        for rate in "${rates[@]}"; do folders+=("$(folder_of "$dataset" "$seed" "$rate")"); done
    done
done
"$python" byte_comparison.py --merge "${folders[@]}" --datasets "${datasets[@]}" --budget-ratio "$budget" \
    "${choose[@]}" --output-dir "$out"
