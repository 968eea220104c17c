"""Checkpoint-mutation fuzz: a saved checkpoint of every method and storage option, changed in one thing (a tensor's
dtype, shape or values, a deleted or added key, an edited config.json field), is either refused with
CompressedCheckpointError or loads to outputs equal to the original's: never a crash, never a silent difference.

Each mutation loads in a child process (``checkpoint_mutation_worker.py``), natively (``import hf_tensorcompress``)
and with ``trust_remote_code`` where hf_tensorcompress cannot be imported, then runs a forward at batch 2 (the
chunked path), at batch 1 (the fused kernels) and a short generation. One child per load path takes a whole batch;
if it dies (a signal), the mutation it was on is recorded as a crash and the rest run in a new child.

Scope: what the library reads (the compressed modules' tensors and spec fields, ``quantization_config`` and the
torchao Linears it hands to transformers) gets every kind of mutation; the dense tensors transformers reads itself
get deletions (a deleted tensor must not load as a random one), not value or dtype changes, which transformers loads
as any plain checkpoint. Value mutations are values no saved layer holds (NaN, inf, indices out of range, a
duplicate in the slot map, a mask keeping another count, bits in padding): a valid value changed to another valid one
is another valid model. Fast tier: a fixed seed and 10 mutations per kind; slow tier: 80 per kind.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torchao.quantization import IntxWeightOnlyConfig
from torchao.quantization.granularity import PerAxis
from transformers import LlamaConfig, LlamaForCausalLM, TorchAoConfig

from hf_tensorcompress import CompressionConfig, apply_compression, quantize_linears
from hf_tensorcompress.runtime.lowbit import StoredMatrix
from hf_tensorcompress.runtime.structure import build_layer
from hf_tensorcompress.runtime.ternary import TernaryTensor

WORKER = Path(__file__).with_name("checkpoint_mutation_worker.py")
FAST, SLOW, SEED = 10, 80, 0
KINDS = {
    "cp": dict(method="cp", rank=2, cp_iterations=2),
    "svd": dict(method="svd", rank=4),
    "svd_factor_bits4": dict(method="svd", rank=4, factor_bits=4, factor_group_size=8),
    "biprop": dict(method="biprop"),
    "lowbit_int4": dict(method="lowbit", weight_bits=4, weight_group_size=16),
    "lowbit_1bit": dict(method="lowbit", weight_bits=1, weight_group_size=16),
    "lowbit_ternary": dict(method="lowbit", weight_bits="ternary", weight_group_size=32),
    "lowbit_ternary_fp16_bias": dict(
        method="lowbit", weight_bits="ternary", weight_group_size=32, bias_dtype="float16"
    ),
    "lowbit_ternary_hadamard": dict(
        method="lowbit", weight_bits="ternary", weight_group_size=32, input_rotation="hadamard", rotation_block=32
    ),
    "mixed": dict(
        method="mixed",
        forms={
            "q_proj": {"method": "lowbit", "weight_bits": 3, "weight_group_size": 32},
            "k_proj": {"method": "svd", "rank": 4, "factor_bits": 2, "factor_group_size": 4},
            "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense"},
            "down_proj": {"method": "cp", "rank": 3, "cp_iterations": 3, "factor_bits": 8},
        },
    ),
    "tt": dict(method="tt", tt_shape=[4, 4, 4], tt_ranks=3),
    "tt_storage_bits8": dict(method="tt", tt_shape=[4, 4, 4], tt_ranks=3, tt_storage_bits=8),
    "tiered": dict(method="tiered", tier_tokens=[64], tier_bits=[8, 3], tier_group_size=32, low_rank=4),
    "tiered_codebook": dict(
        method="tiered", tier_tokens=[64], tier_bits=[4, "codebook"], tier_group_size=32, codebook_size=256
    ),
    "tiered_torchao": dict(method="tiered", tier_tokens=[64], tier_bits=[8, 3], tier_group_size=32, low_rank=4),
}
#: Outcomes the property allows: the library's refusal, or the original outputs.
ALLOWED = {"refused", "equal"}
OTHER_DTYPES = {
    "F32": ["float16", "bfloat16", "int32", "uint8"],
    "F16": ["float32", "uint8", "int8", "int16"],
    "BF16": ["float16", "float32"],
    "U8": ["int16", "int8", "float16", "int32"],
    "I8": ["uint8", "int16", "float32"],
    "I32": ["int64", "int16", "float32", "uint8"],
}


def tiny_lm(biased: bool = False) -> LlamaForCausalLM:
    """A one-layer Llama; ``biased``: its projections have biases (``attention_bias``, ``mlp_bias``)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        attention_bias=biased,
        mlp_bias=biased,
        vocab_size=256,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def build(kind: str, root: Path) -> Path:
    """The saved checkpoint of ``kind`` and, beside it, its inputs and outputs (``reference.pt``)."""
    model = apply_compression(tiny_lm(biased="bias" in kind), CompressionConfig(**KINDS[kind]))
    if kind == "tiered_torchao":
        int8 = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
        model = quantize_linears(model, TorchAoConfig(int8))
    folder = root / kind
    model.save_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "batch": torch.randint(3, 256, (2, 5), generator=generator),
        "single": torch.randint(3, 256, (1, 4), generator=generator),
    }
    with torch.no_grad():
        outputs = {
            "logits": model(inputs["batch"]).logits,
            "step": model(inputs["single"]).logits,
            "generated": model.generate(inputs["single"], max_new_tokens=2, do_sample=False),
        }
    torch.save({"inputs": inputs, "outputs": outputs}, root / f"{kind}.reference.pt")
    return folder


def headers(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """``{key: (safetensors dtype name, shape)}`` of a saved checkpoint."""
    with safe_open(folder / "model.safetensors", framework="pt") as handle:
        return {key: (handle.get_slice(key).get_dtype(), handle.get_slice(key).get_shape()) for key in handle.keys()}


def padded_codes(modules: dict[str, dict]) -> set[str]:
    """Keys of packed codes whose last byte no saved matrix sets to 255: padding only (a stored matrix whose width
    leaves unused codes), or five ternary codes (243 values)."""
    keys = set()
    for name, spec in modules.items():
        with torch.device("meta"):
            layer = build_layer(spec)
        for sub, module in layer.named_modules():
            if isinstance(module, TernaryTensor):
                keys.add(f"{name}.{sub}.codes")
            elif isinstance(module, StoredMatrix) and getattr(module, "bits", 16) != 16 and module.shape[1] % 8 == 4:
                keys.add(f"{name}.{sub}.codes")  # 4 of 8 codes used: the last bits·4 bits are padding
    return keys


def value_mutations(key: str, dtype: str, shape: list[int], padded: set[str]) -> list[dict]:
    """Values no saved layer holds, for the tensors that have a range."""
    last = max(0, int(torch.tensor(shape).prod()) - 1) if shape else 0
    leaf = key.rsplit(".", 1)[-1]
    if dtype in ("F32", "F16", "BF16"):
        return [
            {"op": "value", "key": key, "index": index, "value": value} for index, value in ((0, "nan"), (last, "inf"))
        ]
    if leaf == "slot":
        return [
            {"op": "value", "key": key, "index": 0, "value": -1},
            {"op": "value", "key": key, "index": last, "value": shape[0]},
            {"op": "value", "key": key, "value": "dup"},
        ]
    if leaf == "token_ranks":
        return [{"op": "value", "key": key, "index": 0, "value": v} for v in (0, 99)]
    if leaf == "mask_bits":
        return [{"op": "value", "key": key, "index": i, "value": "fill"} for i in (0, last)]
    if key in padded:
        return [{"op": "value", "key": key, "index": last, "value": 255}]
    return []


def spec_mutations(name: str, spec: dict) -> list[dict]:
    """Edits of one module spec's fields in config.json."""
    base = ["compression_config", "modules", name]
    edits = [{"op": "config", "path": [*base, field], "delete": True} for field in spec]
    for field, value in spec.items():
        path = [*base, field]
        if isinstance(value, bool):
            edits.append({"op": "config", "path": path, "value": not value})
        elif isinstance(value, int):
            edits += [{"op": "config", "path": path, "value": v} for v in (value + 1, value * 2, 0, -1)]
        elif isinstance(value, float):
            edits += [{"op": "config", "path": path, "value": v} for v in (value / 2, 2.0, "x")]
        elif isinstance(value, str):
            edits += [{"op": "config", "path": path, "value": v} for v in ("model.norm", "x", 3)]
        elif value is None:
            edits += [{"op": "config", "path": path, "value": v} for v in (8, "lm_head", 0.5)]
        elif isinstance(value, list) and field != "tiers":
            edits += [{"op": "config", "path": path, "value": v} for v in (value[:-1], [*value, value[-1]], [2, 8, 4])]
    for index, tier in enumerate(spec.get("tiers", [])):
        path = [*base, "tiers", index]
        edits += [
            {"op": "config", "path": [*path, "bits"], "value": bits} for bits in (0, 2, 4, 8, 16, "codebook", True)
        ]
        edits += [{"op": "config", "path": [*path, "group_size"], "value": v} for v in (16, 64, None, 0)]
        edits += [{"op": "config", "path": [*path, "rows"], "value": tier["rows"] + d} for d in (8, -8, -tier["rows"])]
        edits += [{"op": "config", "path": [*path, "codebook_size"], "value": v} for v in (1024, 65536, 300)]
    if "tiers" in spec and len(spec["tiers"]) == 2:  # rows moved between tiers: the total stays right
        moved = [dict(spec["tiers"][0], rows=spec["tiers"][0]["rows"] + 8), dict(spec["tiers"][1])]
        moved[1]["rows"] -= 8
        edits.append({"op": "config", "path": [*base, "tiers"], "value": moved})
        edits.append({"op": "config", "path": [*base, "tiers"], "value": spec["tiers"][:1]})
    return edits


def candidates(folder: Path) -> list[dict]:
    """Every mutation of ``folder``'s checkpoint this test knows, in a fixed order."""
    tensors = headers(folder)
    config = json.loads((folder / "config.json").read_text())
    modules = config["compression_config"]["modules"]
    marker = config["quantization_config"]
    torchao = {key for key in tensors if "._weight_" in key}
    library = {key for key in tensors if any(key.startswith(name + ".") for name in modules)}
    padded = padded_codes(modules)
    found = [{"op": "delete", "key": key} for key in tensors]
    for key, (dtype, shape) in tensors.items():
        if key not in library | torchao:
            continue
        found += [{"op": "dtype", "key": key, "dtype": other} for other in OTHER_DTYPES.get(dtype, [])]
        if shape:
            hows = ("drop_row", "add_row", "flatten", "unsqueeze") if len(shape) > 1 else ("drop_row", "add_row")
            found += [{"op": "shape", "key": key, "how": how} for how in hows if how != "drop_row" or shape[0] > 1]
        if key in library or key.endswith("_weight_scale"):
            found += value_mutations(key, dtype, shape, padded)
    for name in modules:
        found += [
            {"op": "add", "key": f"{name}.extra", "dtype": "float32", "shape": [2]},
            {"op": "add", "key": f"{name}.tiers.7.codes", "dtype": "uint8", "shape": [4, 8]},
        ]
        found += spec_mutations(name, modules[name])
    found.append({"op": "add", "key": "model.layers.0.unused", "dtype": "float32", "shape": [3]})
    found += [
        {"op": "config", "path": ["compression_config", "method"], "value": "cpp"},
        {"op": "config", "path": ["compression_config", "modules"], "value": {}},
        {"op": "config", "path": ["quantization_config", "version"], "value": 3},
        {"op": "config", "path": ["tie_word_embeddings"], "value": True},
    ]
    if "linears" in marker:
        linears = ["quantization_config", "linears"]
        weight_dtype = [*linears, "quant_type", "default", "_data", "weight_dtype", "_data"]
        found += [
            {"op": "config", "path": linears, "delete": True},
            {
                "op": "config",
                "path": ["quantization_config"],
                "value": {"quant_method": "tensorcompress", "version": 1},
            },
            {"op": "config", "path": [*linears, "quant_method"], "value": "bitsandbytes"},
            {"op": "config", "path": weight_dtype, "value": "int4"},
            {"op": "config", "path": [*linears, "quant_type", "default", "_type"], "value": "Int8WeightOnlyConfig"},
            {"op": "config", "path": [*linears, "modules_to_not_convert"], "value": ["model.layers.0.mlp.up_proj"]},
        ]
    return [{"op": "none"}, *found]


def chosen(kind: str, folder: Path, count: int, seed: int) -> list[dict]:
    """The untouched checkpoint first (it must load equal), then ``count`` seeded mutations of the candidates."""
    everything = candidates(folder)
    picked = random.Random(f"{seed}-{kind}").sample(everything[1:], min(count, len(everything) - 1))
    return [everything[0], *picked]


def worker(mode: str, jobs: list[dict], scratch: Path) -> subprocess.Popen:
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(scratch / "modules"), OMP_NUM_THREADS="1")
    if mode == "remote":
        env.pop("PYTHONPATH", None)
    command = [sys.executable, str(WORKER), mode, str(scratch / "jobs.json"), str(scratch)]
    return subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(process: subprocess.Popen, jobs: list[dict], mode: str, scratch: Path, depth: int = 0) -> dict:
    """Results by mutation id; a child killed by a signal: its mutation in flight is a crash, the rest rerun."""
    stdout, stderr = process.communicate(timeout=900)
    results = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[result.pop("id")] = result
    pending = [job for job in jobs if job["id"] not in results]
    if process.returncode != 0 and pending:
        results[pending[0]["id"]] = {"outcome": "crash", "error": f"exit {process.returncode}: {stderr[-400:]}"}
        rest = pending[1:]
        if rest:
            again = scratch / f"again{depth}"
            results.update(collect(worker(mode, rest, again), rest, mode, again, depth + 1))
    elif pending:
        raise AssertionError(f"the {mode} worker stopped early without a signal: {stderr[-2000:]}")
    return results


def fuzz(root: Path, count: int, seed: int) -> tuple[dict, list[str]]:
    """Counts per kind and the failures, for ``count`` mutations per kind and both load paths."""
    jobs = []
    for kind in KINDS:
        folder = build(kind, root)
        for index, mutation in enumerate(chosen(kind, folder, count, seed)):
            jobs.append(
                {
                    "id": f"{kind}/{index}",
                    "kind": kind,
                    "folder": str(folder),
                    "reference": str(root / f"{kind}.reference.pt"),
                    "mutation": mutation,
                }
            )
    running = {mode: worker(mode, jobs, root / mode) for mode in ("native", "remote")}
    results = {mode: collect(process, jobs, mode, root / mode) for mode, process in running.items()}
    counts, failures = {}, []
    for job in jobs:
        for mode in running:
            result = results[mode][job["id"]]
            if job["mutation"]["op"] == "none" and result["outcome"] != "equal":
                failures.append(f"{mode} {job['id']} untouched checkpoint: {result}")
            elif result["outcome"] not in ALLOWED:
                failures.append(f"{mode} {job['id']} {json.dumps(job['mutation'])}: {result}")
            if job["mutation"]["op"] != "none":
                counts.setdefault(job["kind"], Counter())[f"{mode} {result['outcome']}"] += 1
    return counts, failures


def report(counts: dict) -> str:
    lines = []
    for kind, counter in counts.items():
        tried = sum(value for key, value in counter.items() if key.startswith("native"))
        parts = ", ".join(f"{key}={value}" for key, value in sorted(counter.items()))
        lines.append(f"{kind}: {tried} mutations × 2 load paths: {parts}")
    return "\n".join(lines)


def check(tmp_path: Path, count: int) -> None:
    counts, failures = fuzz(tmp_path, count, SEED)
    print("\n" + report(counts))
    assert not failures, f"{len(failures)} mutations crashed or loaded silently wrong:\n" + "\n".join(failures)


def test_every_mutation_is_refused_or_harmless(tmp_path):
    check(tmp_path, FAST)


@pytest.mark.slow
def test_many_mutations_are_refused_or_harmless(tmp_path):
    check(tmp_path, SLOW)


FAKE_WORKER = """
import json, os, signal, sys
for job in json.load(open(sys.argv[2])):
    if job["mutation"]["op"] == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    print(json.dumps({"id": job["id"], "outcome": "equal"}), flush=True)
"""


def test_a_crash_is_reported_and_the_rest_run_in_a_new_child(tmp_path, monkeypatch):
    """The harness itself: a child killed by a signal fails its mutation in flight, not pytest, and the mutations
    after it still run."""
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER)
    monkeypatch.setattr(sys.modules[__name__], "WORKER", fake)
    ops = ["none", "crash", "none", "crash", "none"]
    jobs = [{"id": str(index), "mutation": {"op": op}} for index, op in enumerate(ops)]
    results = collect(worker("native", jobs, tmp_path / "run"), jobs, "native", tmp_path / "run")
    assert [results[str(index)]["outcome"] for index in range(5)] == ["equal", "crash", "equal", "crash", "equal"]
    assert "exit -11" in results["1"]["error"]
