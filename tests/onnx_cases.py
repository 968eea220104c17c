"""Models the ONNX export tests compress, save and export, and the checks they share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from helpers import LM_HIDDEN, tiny_causal_lm, tiny_time_series
from onnx import numpy_helper
from safetensors.torch import load_file

from hf_tensorcompress import CompressionConfig, apply_compression, load_model
from hf_tensorcompress.deploy.onnx import export_onnx
from hf_tensorcompress.deploy.onnx.embeddings import narrow_slot
from hf_tensorcompress.evaluation.forecasting import point_forecast
from hf_tensorcompress.evaluation.mean_feedback import mean_feedback_forecast

#: name → compression options of the tiny PatchTST cases
FORECAST_CASES = {
    "cp": {"method": "cp", "rank": 0.5},
    "cp-int4": {"method": "cp", "rank": 0.5, "factor_bits": 4, "factor_group_size": 4},
    "svd": {"method": "svd", "rank": 0.5},
    "svd-int3": {"method": "svd", "rank": 0.5, "factor_bits": 3},
    "svd-int2": {"method": "svd", "rank": 0.5, "factor_bits": 2},
    "svd-int8": {"method": "svd", "rank": 0.5, "factor_bits": 8},
    "svd-bf16": {"method": "svd", "rank": 0.5, "factor_bits": 16},
    "cp-ternary": {"method": "cp", "rank": 0.5, "factor_bits": "ternary", "factor_group_size": 4},
    # factors whose groups ONNX Runtime's kernels take (rank 16, 32 columns: blocks of 16 and 32)
    "cp-int4-ortops": {"method": "cp", "rank": 16, "factor_bits": 4, "factor_group_size": 16},
    "svd-int4-ortops": {"method": "svd", "rank": 16, "factor_bits": 4, "factor_group_size": 16},
    "biprop": {"method": "biprop"},
    "lowbit-int2": {"method": "lowbit", "weight_bits": 2, "weight_group_size": 8},
    "lowbit-int3": {"method": "lowbit", "weight_bits": 3, "weight_group_size": 8},
    "lowbit-ternary": {"method": "lowbit", "weight_bits": "ternary", "weight_group_size": 8},
    "lowbit-ternary-fp16-bias": {
        "method": "lowbit",
        "weight_bits": "ternary",
        "weight_group_size": 8,
        "bias_dtype": "float16",
    },
    "lowbit-int8": {"method": "lowbit", "weight_bits": 8, "weight_group_size": None},
    "lowbit-1bit": {"method": "lowbit", "weight_bits": 1, "weight_group_size": 8},
    # every Linear of the tiny PatchTST has 16 or 32 inputs: blocks of 16 take MatMulNBits
    "lowbit-int4-ortops": {"method": "lowbit", "weight_bits": 4, "weight_group_size": 16},
    # inputs rotated in the graph (sign bits, then butterflies) before the codes' product
    "lowbit-ternary-hadamard": {
        "method": "lowbit",
        "weight_bits": "ternary",
        "weight_group_size": 16,
        "input_rotation": "hadamard",
        "rotation_block": 16,
    },
    "lowbit-int4-ortops-randomized-hadamard": {
        "method": "lowbit",
        "weight_bits": 4,
        "weight_group_size": 16,
        "input_rotation": "randomized-hadamard",
        "rotation_block": 16,
    },
    "mixed": {
        "method": "mixed",
        "forms": {
            "q_proj": {"method": "lowbit", "weight_bits": 4, "weight_group_size": 16},
            "k_proj": {"method": "svd", "rank": 4, "factor_bits": 2},
            "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
            "out_proj": {"method": "cp", "rank": 3, "cp_iterations": 5},
        },
    },
}

#: name → compression options of the tiny Autoformer and Informer cases
SEQ2SEQ_CASES = {
    "cp": {"method": "cp", "rank": 0.5},
    "cp-int4": {"method": "cp", "rank": 0.5, "factor_bits": 4, "factor_group_size": 4},
    "svd": {"method": "svd", "rank": 0.5},
    "svd-int4": {"method": "svd", "rank": 0.5, "factor_bits": 4},
    "biprop": {"method": "biprop"},
    "lowbit-int4": {"method": "lowbit", "weight_bits": 4, "weight_group_size": 8},
}

#: name → compression options of the tiny Llama cases (None: the dense model)
LM_CASES = {
    "dense": None,
    "tiered-int4-int2": {"method": "tiered", "tier_tokens": [40], "tier_bits": [4, 2], "tier_group_size": 8},
    "tiered-codebook-lowrank": {
        "method": "tiered",
        "tier_tokens": [40],
        "tier_bits": [3, "codebook"],
        "tier_group_size": 8,
        "codebook_dim": 4,
        "codebook_size": 256,
        "low_rank": 4,
    },
    "tt": {"method": "tt", "tt_order": 3, "tt_ranks": 4},
    "tt-int8": {"method": "tt", "tt_order": 3, "tt_ranks": 4, "tt_storage_bits": 8},
    # tiers whose groups ONNX Runtime's kernels take (on the WIDE_LM Llama)
    "tiered-ortops": {"method": "tiered", "tier_tokens": [40], "tier_bits": [4, 8], "tier_group_size": 16},
}

#: LM cases built on a 32-wide Llama (the contrib ops' blocks are powers of two of at least 16; the default is 24)
WIDE_LMS = ("tiered-ortops",)

PROMPT = [0, 5, 17, 33, 8, 90]


def saved_forecaster(folder: Path, options: dict) -> Path:
    model = tiny_time_series("patchtst")
    apply_compression(model, CompressionConfig(**options))
    model.save_pretrained(folder)
    return folder


def saved_seq2seq(folder: Path, family: str, options: dict) -> Path:
    """A tiny Autoformer or Informer (full attention: ProbSparse samples at random and does not export)."""
    model = tiny_time_series(family, informer_attention="full")
    apply_compression(model, CompressionConfig(**options))
    model.save_pretrained(folder)
    return folder


def seq2seq_inputs(folder: Path, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random past values and time features of the saved model's shapes (some past values marked unobserved)."""
    config, rng = load_model(folder).config, np.random.default_rng(seed)
    past, future = config.context_length + max(config.lags_sequence), config.prediction_length
    values = rng.standard_normal((batch, past, config.input_size)).astype(np.float32)
    return {
        "past_values": values,
        "past_time_features": rng.standard_normal((batch, past, config.num_time_features)).astype(np.float32),
        "past_observed_mask": (rng.random(values.shape) > 0.1).astype(np.float32),
        "future_time_features": rng.standard_normal((batch, future, config.num_time_features)).astype(np.float32),
    }


def torch_seq2seq_forecast(folder: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The PyTorch reference: Autoformer's ``point_forecast`` (one forward), Informer's ``mean_feedback_forecast``."""
    model = load_model(folder).eval()
    tensors = {name: torch.from_numpy(value) for name, value in inputs.items()}
    with torch.no_grad():
        if model.config.model_type == "autoformer":
            past = tensors["past_values"]
            future = torch.zeros(past.shape[0], model.config.prediction_length, *past.shape[2:])
            return point_forecast(model, {**tensors, "future_values": future}).numpy()
        return mean_feedback_forecast(model, **tensors).numpy()


def decisive(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (a tied Llama) with weights large enough for greedy decoding to change tokens (at the default init of
    std 0.02 it repeats one token)."""
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.normal_(0.0, 0.5)
    return model


def saved_lm(folder: Path, options: dict | None, hidden: int = LM_HIDDEN) -> Path:
    """A tiny tied Llama whose greedy tokens change (``decisive``)."""
    model = decisive(tiny_causal_lm("llama", hidden=hidden))
    if options is not None:
        apply_compression(model, CompressionConfig(**options))
    model.save_pretrained(folder)
    return folder


def saved_gemma3(folder: Path, options: dict) -> Path:
    """A tiny Gemma 3 (its embedding scaled by √hidden) whose greedy tokens change: a small embedding and random
    norm weights (Gemma normalises every layer's output, so at the default init the scaled embedding outweighs the
    layers and decoding repeats one token)."""
    from family_models import LANGUAGE_MODELS

    model_class, config = LANGUAGE_MODELS["gemma3_text"]
    torch.manual_seed(0)
    model = model_class(config()).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 0.1)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.normal_(0.0, 0.5)
            elif "Norm" in type(module).__name__:
                module.weight.normal_(0.0, 3.0)
    apply_compression(model, CompressionConfig(**options))
    model.save_pretrained(folder)
    return folder


def exported(folder: Path, ort_ops: bool = True) -> Path:
    return export_onnx(folder, folder / "model.onnx", ort_ops=ort_ops)


def contrib_ops(onnx_file: Path) -> set[str]:
    """The ONNX Runtime contrib ops (domain ``com.microsoft``) in the file's graph."""
    return {node.op_type for node in onnx.load(str(onnx_file)).graph.node if node.domain == "com.microsoft"}


def torch_forecast(folder: Path, past_values: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return load_model(folder).eval()(past_values=torch.from_numpy(past_values)).prediction_outputs.numpy()


def torch_greedy(folder: Path, prompt: list[int], new_tokens: int) -> list[int]:
    model = load_model(folder).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


def stored_tensors_kept(folder: Path, onnx_file: Path) -> list[str]:
    """Checkpoint tensors of the compressed modules that no ONNX initializer holds byte for byte (should be none)."""
    checkpoint = load_file(folder / "model.safetensors")
    model = onnx.load(str(onnx_file))
    held = {numpy_helper.to_array(init).tobytes() for init in model.graph.initializer}
    compressed = [
        key
        for key, tensor in checkpoint.items()
        if any(
            part in key
            for part in ("stored_", "factor_", "mask_bits", "tiers.", ".slot", ".left.", ".right.", "cores.", "trains.")
        )
        and tensor.numel() > 1
    ]
    raw = {key: _as_held(key, checkpoint[key]).contiguous().view(torch.uint8).numpy().tobytes() for key in compressed}
    return [key for key in compressed if raw[key] not in held]


def _as_held(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as the file should hold it: the tiered token→row map narrowed to 16 bits where the rows fit,
    every other tensor as stored (bf16 compared as its bytes)."""
    return narrow_slot(tensor)[0] if key.endswith(".slot") else tensor
