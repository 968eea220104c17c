#!/usr/bin/env bash
# The GPU-sized byte comparison of the search over forms: PatchTST medium, two weeks of context, four days ahead,
# 3,000 steps of batch 64 over every training window, electricity, Appliances Energy and bike rentals as the recipe
# reads them, every arm at budget 1/16 of every Linear's fp32 bytes. Every (data set, seed, group of arms) is its own
# process, writing <OUTPUT_DIR>/<data set>-seed<S>-<arms>/; POOL of them share the GPU at once, under CUDA MPS where
# nvidia-cuda-mps-control starts (their small kernels then run side by side instead of in turns; MPS=0: never).
# The groups start in the order RUN_GROUPS lists them, most important first. A finished folder (its comparison.json is
# written last) is skipped when the command runs again, so a run cut short goes on where it stopped. DEADLINE
# (seconds) is for a machine lent by the minute: no process starts that would not finish by then (judged by how long
# the slowest of its group took; before one of its group has finished, only while more than half the time is left),
# and the unfinished ones are stopped at it. The last step merges every finished folder into the table.
#
# RUN_GROUPS: groups of arms, a space between groups, a comma between the arms of one group. The arms derived from the
# search's bytes (greedy-bytes, uniform-*-bytes, random-bytes) need smartformer-bytes in their group, greedy-bytes
# needs dense too. DATASETS: names or paths of CSV files, as recipes/byte_table_cpu.sh takes them. STEPS and DEVICE
# replace the steps and the device (DEVICE=cpu STEPS=8: a trial run of the plumbing).
#
#     POOL=15 bash recipes/byte_table_gpu.sh [OUTPUT_DIR] [SEEDS...]
set -euo pipefail
source "$(dirname "$0")/byte_table_args.sh" "electricity appliances_energy bikesharing" byte-table-gpu "$@"
pool=${POOL:-$(($(nproc) > 1 ? $(nproc) - 1 : 1))}
deadline=${DEADLINE:-0}
device=${DEVICE:-cuda}
python=${PYTHON:-python}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
groups=(${RUN_GROUPS:-dense,ptq-int8-all,ptq-int4-all,smartformer-bytes,greedy-bytes qat-int2-all ends-8-4
        smartformer-bytes,uniform-lowbit-bytes,random-bytes qat-ternary-all qat-int4-all lowbit-2-g128
        lowbit-ternary-g128 smartformer-bytes,uniform-svd-bytes,uniform-biprop-bytes})
common=(--device "$device" --size medium --context 336 --horizon 96 --steps "${STEPS:-3000}" --batch-size 64
        --train-stride 1 --random-draws 1 --budget-ratio 1/16 --forms dense lowbit svd cp biprop
        --factor-widths 4 2 ternary --weight-group-sizes 32 row --keep-ratios 0.5 --max-candidates 4
        --search-schedule 4 2 3 --byte-reward validation_loss)

start_mps() {  # prints nothing and starts nothing where MPS does not run; the runs then take turns on the GPU
    [[ $device == cuda && ${MPS:-1} != 0 ]] && command -v nvidia-cuda-mps-control > /dev/null || return 0
    local folder
    folder=$(mktemp -d)  # short: the pipe is a socket, whose path has a length limit
    export CUDA_MPS_PIPE_DIRECTORY=$folder/pipe CUDA_MPS_LOG_DIRECTORY=$folder/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d &&
        timeout 60 "$python" -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
        echo "CUDA MPS: on"
        trap 'echo quit | nvidia-cuda-mps-control' EXIT
    else
        echo "CUDA MPS: did not start; the runs take turns on the GPU"
        echo quit | nvidia-cuda-mps-control 2> /dev/null || true
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
}

mkdir -p "$out"
start_mps
begun=$SECONDS
declare -A running=() started=() group_of=() slowest=()
failed=0
reap() {  # note every run that ended, and how long it took if it succeeded
    local folder group took
    for folder in "${!running[@]}"; do
        kill -0 "${running[$folder]}" 2> /dev/null && continue
        if wait "${running[$folder]}"; then
            group=${group_of[$folder]} took=$((SECONDS - started[$folder]))
            ((took > ${slowest[$group]:-0})) && slowest[$group]=$took
            echo "$(date +%T) finished in $took s: $folder"
        else
            failed=1
            echo "byte_table_gpu.sh: a run failed (its log: $folder.log)" >&2
        fi
        unset "running[$folder]"
    done
}
left() { echo $((deadline - (SECONDS - begun))); }
fits() {  # whether a run of this group would end before the deadline
    ((deadline == 0)) && return 0
    if [[ -n ${slowest[$1]:-} ]]; then ((slowest[$1] < $(left))); else ((2 * $(left) > deadline)); fi
}
folders=()
for group in "${groups[@]}"; do
    for seed in "${seeds[@]}"; do
        for dataset in "${datasets[@]}"; do
            folder="$out/$(label "$dataset")-seed$seed-${group//,/+}"
            folders+=("$folder")
            [[ -f $folder/comparison.json ]] && continue
            while ((${#running[@]} >= pool)); do sleep 1; reap; done
            if ! fits "$group"; then
                echo "$(date +%T) not started, it would not end by DEADLINE: $folder"
                continue
            fi
            echo "$(date +%T) $folder.log"
            "$python" byte_comparison.py "${common[@]}" --runs ${group//,/ } --datasets "$dataset" --seeds "$seed" \
                --output-dir "$folder" > "$folder.log" 2>&1 &
            running[$folder]=$!
            started[$folder]=$SECONDS
            group_of[$folder]=$group
        done
    done
done
while ((${#running[@]} > 0)); do
    if ((deadline > 0 && $(left) <= 0)); then
        for folder in "${!running[@]}"; do
            echo "$(date +%T) stopped at DEADLINE: $folder"
            kill "${running[$folder]}" 2> /dev/null || true
        done
        break
    fi
    sleep 1
    reap
done
finished=()
for folder in "${folders[@]}"; do [[ -f $folder/comparison.json ]] && finished+=("$folder"); done
if ((${#finished[@]} == 0)); then
    echo "byte_table_gpu.sh: no run finished; nothing to merge" >&2
    exit 1
fi
echo "$(date +%T) merging ${#finished[@]} of ${#folders[@]} runs"
"$python" byte_comparison.py --merge "${finished[@]}" --datasets "${datasets[@]}" --budget-ratio 1/16 \
    --output-dir "$out"
if ((failed)) || ((${#finished[@]} < ${#folders[@]})); then
    echo "byte_table_gpu.sh: $((${#folders[@]} - ${#finished[@]})) runs did not finish;" \
        "run the command again to add them" >&2
    exit 1
fi
