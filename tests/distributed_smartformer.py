"""Run by tests/test_distributed.py under ``accelerate launch --multi_gpu --num_processes 2`` (CPU, gloo).

Trains a tiny PatchTST with the search, then writes, per process, the ranks it held after every stage, a
fingerprint of its final parameters and the gradients of one backward pass on process-specific data. With a second
argument ``bytes``: the byte search (rank and factor width of every Linear) on a tiny PatchTST whose every Linear is SVD;
``forms``: the search over the form of every Linear of a dense tiny PatchTST; ``shares``: the same search measuring
every Linear's sensitivity on validation windows (``front_only``, ``share_by="sensitivity"``) on the main process and
starting from the greedy allocation by it (``start="greedy"``);
``shared``: the search over forms on a two-layer PatchTST whose second layer computes with the first's Linears.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smartformer_fixtures import dense_patchtst, sines, tiny_patchtst  # noqa: E402
from test_byte_search import every_linear_svd  # noqa: E402

from hf_tensorcompress.search import SearchConfig  # noqa: E402
from hf_tensorcompress.search.trainer import SmartformerTrainer  # noqa: E402


def main(output_dir: str, mode: str = "ranks") -> None:
    models = {"ranks": lambda: tiny_patchtst(layers=2), "bytes": every_linear_svd}
    model = models.get(mode, lambda: dense_patchtst(2 if mode == "shared" else 1))()
    budget = {"param_budget": 0.45} if mode == "ranks" else {"byte_budget": 1 / 6, "factor_widths": (8, 4, 2)}
    if mode in ("forms", "shares", "shared"):
        budget.update(byte_budget=1 / 8, forms=("dense", "lowbit", "svd", "cp", "biprop"), weight_group_sizes=(16,))
    if mode == "shares":
        budget.update(front_only=True, share_by="sensitivity", start="greedy")
    if mode == "shared":
        later = [name for name, m in model.named_modules() if ".layers.1." in name and isinstance(m, torch.nn.Linear)]
        budget.update(shared={name: name.replace(".layers.1.", ".layers.0.") for name in later})
    search = SearchConfig(
        interval=3, consecutive_actions=2, max_actions_per_layer=4, epsilon_start=0.9, seed=2, **budget
    )
    args = TrainingArguments(
        output_dir,
        max_steps=36,
        per_device_train_batch_size=8,
        learning_rate=2e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        seed=0,
        use_cpu=True,  # MULTI_CPU, gloo
    )
    validation = sines(seed=1) if mode == "shares" else None
    trainer = SmartformerTrainer(model=model, args=args, train_dataset=sines(), eval_dataset=validation, search=search)
    trainer.train()

    # one more backward through the current (rebuilt) DDP wrapper, with different data on each process
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    wrapped = trainer.model_wrapped
    wrapped.zero_grad()
    wrapped(past_values=torch.randn(4, 32, 3), future_values=torch.randn(4, 8, 3)).loss.backward()
    result = {
        "world_size": dist.get_world_size(),
        "ddp": type(wrapped).__name__,
        "rank_history": trainer.rank_history,
        "bits_history": [record.get("bits") for record in trainer.search.trace],
        "factor_bits": {n: s.get("factor_bits") for n, s in model.config.compression_config["modules"].items()},
        "chosen": [record.get("chosen") for record in trainer.search.trace],
        "shares": [record["sensitivity_shares"] for record in trainer.search.trace if "sensitivity_shares" in record],
        "greedy": [record["greedy_start"] for record in trainer.search.trace if "greedy_start" in record],
        "searched": [group.name for group in trainer.search.groups],
        "types": {name: type(module).__name__ for name, module in model.named_modules()},
        "trace_steps": [record["step"] for record in trainer.search.trace],
        "params": {name: p.detach().double().sum().item() for name, p in model.named_parameters()},
        "grads": {name: p.grad.double().sum().item() for name, p in model.named_parameters() if p.grad is not None},
    }
    with open(os.path.join(output_dir, f"process-{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    dist.destroy_process_group()  # now, not in the group's destructor at exit (which can abort a rank)


if __name__ == "__main__":
    main(*sys.argv[1:])
