# The byte tables' shared reading of their command line, sourced by byte_table_cpu.sh and byte_table_gpu.sh with
# `source byte_table_args.sh <default data sets> <default output folder> "$@"`: sets datasets (names, or absolute
# paths of CSV files), out (absolute) and seeds, defines label, and stops when two data sets would share a folder.
# Leaves the shell in recipes/.
defaults=$1 default_out=$2
shift 2
datasets=()
for dataset in ${DATASETS:-$defaults}; do  # a file's or folder's path, absolute
    [[ -e $dataset ]] && dataset=$(realpath "$dataset")
    datasets+=("$dataset")
done
out=$(realpath -m "${1:-$default_out}")  # where the command was run from, not under recipes/
shift || true
seeds=(${@:-0 1 2})

label() {  # a data set's folder name, as byte_comparison.dataset_folder names it: the name without its suffixes
    local name=${1##*/}
    echo "${name%%.*}"
}

labels=$(for dataset in "${datasets[@]}"; do label "$dataset"; done | sort | uniq -d)
if [[ -n $labels ]]; then  # their runs would share a folder, and the second would be skipped as finished
    echo "${0##*/}: DATASETS: several data sets would write to the same folder ($labels); rename the files apart" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")"
