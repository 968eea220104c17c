"""Wall time of Smartformer training (CP attention + RL rank search) against dense training for the same steps.

Trains a PatchTST on real data (Appliances Energy, or ``--dataset electricity``) three ways, one after the other
in this process, with the same steps, batches and seed: dense, CP with fixed ranks (the layer's own cost), and Smartformer (CP + search).
The Smartformer time is split into agent time (MDP + A2C), re-decomposition time (set_rank, optimizer swap,
config refresh, DDP rebuild), importance accumulation and the rest (training). Target: Smartformer / dense ≤ 1.5
(≤ 1.2 with ``--size medium``, the setting of the recipe's ``--size medium``).
With ``--bytes RATIO`` it times the byte search instead (every Linear with both sides >= 32 as ``U Vᵀ``, rank and
factor width per layer searched under a byte budget of RATIO × fp32, factors trained at the chosen widths) against
ternary QAT of every Linear for the same steps: target byte search / ternary QAT ≤ 1.3.
The last printed line is one JSON object with the figures.

    OMP_NUM_THREADS=1 python benchmarks/search_overhead.py [--steps 200] [--interval 10] [--repeats 2]
    OMP_NUM_THREADS=1 python benchmarks/search_overhead.py --size medium
    OMP_NUM_THREADS=1 python benchmarks/search_overhead.py --size medium --dataset electricity --context 336 --budget 0.2
    python benchmarks/search_overhead.py --size medium --device cuda --dtype bf16   # bf16 mixed precision on a GPU
    OMP_NUM_THREADS=1 python benchmarks/search_overhead.py --size medium --bytes 1/16 [--factor-widths 16 8 4 3 2 ternary]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from fractions import Fraction

import torch
from timing import add_device_arguments, device_and_dtype
from transformers import PatchTSTConfig, PatchTSTForPrediction, Trainer, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.baselines.quantization import ternary_training
from hf_tensorcompress.data import BUILTIN_SOURCES, load_forecasting_dataset, standardization_of
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.trainer import SmartformerTrainer


class Windows(torch.utils.data.Dataset):
    def __init__(self, values: torch.Tensor, context: int, horizon: int) -> None:
        self.values, self.context, self.horizon = values, context, horizon

    def __len__(self) -> int:
        return len(self.values) - self.context - self.horizon + 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.values[i : i + self.context + self.horizon]
        return {"past_values": window[: self.context], "future_values": window[self.context :]}


def train_windows(dataset: str, context: int, horizon: int) -> Windows:
    """Every window of the standardised training split of a built-in data set."""
    split = load_forecasting_dataset(dataset)["train"]
    columns = list(standardization_of(split).columns)
    values = torch.tensor(split.select_columns(columns).to_pandas().to_numpy(), dtype=torch.float32)
    return Windows(values, context, horizon)


def model(method: str | None, args: argparse.Namespace, channels: int) -> PatchTSTForPrediction:
    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=channels,
        context_length=args.context,
        prediction_length=args.horizon,
        patch_length=16,
        patch_stride=8,
        d_model=args.d_model,
        num_attention_heads=args.heads,
        num_hidden_layers=args.layers,
        ffn_dim=2 * args.d_model,
    )
    dense = PatchTSTForPrediction(config)
    return dense if method is None else apply_compression(dense, CompressionConfig(method=method, rank=1.0))


def every_linear(method: str, args: argparse.Namespace, channels: int) -> PatchTSTForPrediction:
    """Every Linear ternary-QAT (``ternary``), or every one with both sides >= 32 as ``U Vᵀ`` at full rank (``svd``)."""
    dense = model(None, args, channels)
    linears = {name: m for name, m in dense.named_modules() if isinstance(m, torch.nn.Linear)}
    if method == "ternary":
        return ternary_training(dense, list(linears))
    ranks = {
        name: min(m.in_features, m.out_features)
        for name, m in linears.items()
        if min(m.in_features, m.out_features) >= 32
    }
    return apply_compression(dense, CompressionConfig(method="svd", target_modules=list(ranks), rank=1.0, ranks=ranks))


def bytes_main(args: argparse.Namespace, search: SearchConfig, training, data, channels: int) -> None:
    """Byte search against ternary QAT of every Linear, the same steps; the last line is the JSON result."""
    search.byte_budget, search.param_budget, search.factor_widths = args.bytes, None, tuple(args.factor_widths)
    search.validate()
    ternary_runs, byte_runs = [], []
    for _ in range(args.repeats):
        ternary_runs.append(
            timed(Trainer(model=every_linear("ternary", args, channels), args=training, train_dataset=data))
        )
        trainer = SmartformerTrainer(
            model=every_linear("svd", args, channels), args=training, train_dataset=data, search=search
        )
        byte_runs.append((timed(trainer), trainer))
    ternary_seconds = min(ternary_runs)
    byte_seconds, searched = min(byte_runs, key=lambda run: run[0])
    parts = {key: round(value, 3) for key, value in searched.search_seconds.items()}
    result = {
        "steps": args.steps,
        "repeats": args.repeats,
        "byte_budget": args.bytes,
        "factor_widths": list(args.factor_widths),
        "stages": len(searched.search.trace),
        "search_finished": searched.search.done,
        "ternary_qat_seconds": round(ternary_seconds, 3),
        "byte_search_seconds": round(byte_seconds, 3),
        "byte_search_agent_seconds": parts["agent"],
        "byte_search_redecompose_seconds": parts["redecompose"],
        "byte_search_importance_seconds": parts["importance"],
        "byte_search_over_ternary_qat": round(byte_seconds / ternary_seconds, 3),
        "target_byte_search_over_ternary_qat": 1.3,
        "size": args.size or "custom",
        "dataset": args.dataset,
        "device": str(training.device),
        "dtype": args.dtype,
    }
    print(f"ternary QAT {ternary_seconds:.1f}s | byte search {byte_seconds:.1f}s (agent {parts['agent']}s)")
    print(json.dumps(result))


def timed(trainer: Trainer) -> float:
    """End-to-end training time (on a GPU, once every queued kernel has run)."""
    start = time.perf_counter()
    trainer.train()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--repeats", type=int, default=2, help="each variant runs this often, interleaved; the minimum counts"
    )
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dataset", choices=sorted(BUILTIN_SOURCES), default="appliances_energy")
    parser.add_argument(
        "--size",
        choices=("medium",),
        default=None,
        help="medium: the Smartformer recipe's --size medium (d_model 128, 8 heads, 2 layers, batch 16, stages of 8 "
        "steps, k = 3, at most 6 actions per layer); target Smartformer / dense <= 1.2",
    )
    parser.add_argument("--budget", type=float, default=0.75, help="--size medium: the search's parameter budget")
    parser.add_argument(
        "--bytes",
        type=lambda text: float(Fraction(text)),
        default=None,
        metavar="RATIO",
        help="time the byte search at this budget (e.g. 1/16) against ternary QAT of every Linear instead",
    )
    parser.add_argument(
        "--factor-widths",
        type=lambda text: int(text) if text.isdigit() else text,
        nargs="+",
        default=list(FACTOR_WIDTHS),
        help=f"--bytes: the factor widths the search chooses among (default {' '.join(map(str, FACTOR_WIDTHS))})",
    )
    add_device_arguments(parser)
    args = parser.parse_args()
    device, dtype = device_and_dtype(args)
    target = 1.5
    search = SearchConfig(interval=args.interval, trace_file=None, plot_file=None)
    if args.size == "medium":
        args.d_model, args.heads, args.layers, args.batch_size, args.interval, target = 128, 8, 2, 16, 8, 1.2
        search = SearchConfig(
            interval=8,
            consecutive_actions=3,
            max_actions_per_layer=6,
            param_budget=args.budget,
            trace_file=None,
            plot_file=None,
        )

    data = train_windows(args.dataset, args.context, args.horizon)
    channels = data.values.shape[1]
    out = tempfile.mkdtemp()
    training = TrainingArguments(
        out,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        use_cpu=device.type == "cpu",
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
    )

    if args.bytes is not None:
        bytes_main(args, search, training, data, channels)
        return
    # interleaved repeats on a shared machine: the fastest run of each variant is the least disturbed one
    dense_runs, fixed_runs, smart_runs = [], [], []
    for _ in range(args.repeats):
        dense_runs.append(timed(Trainer(model=model(None, args, channels), args=training, train_dataset=data)))
        fixed_runs.append(timed(Trainer(model=model("cp", args, channels), args=training, train_dataset=data)))
        trainer = SmartformerTrainer(
            model=model("cp", args, channels), args=training, train_dataset=data, search=search
        )
        smart_runs.append((timed(trainer), trainer))
    dense_seconds, fixed_seconds = min(dense_runs), min(fixed_runs)
    smart_seconds, smart = min(smart_runs, key=lambda run: run[0])
    parts = {key: round(value, 3) for key, value in smart.search_seconds.items()}
    result = {
        "steps": args.steps,
        "repeats": args.repeats,
        "stages": len(smart.search.trace),
        "search_finished": smart.search.done,
        "dense_seconds": round(dense_seconds, 3),
        "cp_fixed_rank_seconds": round(fixed_seconds, 3),
        "smartformer_seconds": round(smart_seconds, 3),
        "smartformer_agent_seconds": parts["agent"],
        "smartformer_redecompose_seconds": parts["redecompose"],
        "smartformer_importance_seconds": parts["importance"],
        "smartformer_training_seconds": round(smart_seconds - sum(smart.search_seconds.values()), 3),
        "smartformer_over_dense": round(smart_seconds / dense_seconds, 3),
        "cp_fixed_over_dense": round(fixed_seconds / dense_seconds, 3),
        "search_only_over_cp_fixed": round(smart_seconds / fixed_seconds, 3),
        "size": args.size or "custom",
        "dataset": args.dataset,
        "context": args.context,
        "device": str(device),
        "dtype": args.dtype,
        "target_smartformer_over_dense": target,
    }
    print(
        f"dense {dense_seconds:.1f}s | CP fixed ranks {fixed_seconds:.1f}s | Smartformer {smart_seconds:.1f}s "
        f"(agent {parts['agent']}s, re-decomposition {parts['redecompose']}s, importance {parts['importance']}s)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
