"""One step of a user journey, run as its own process: ``python journey_steps.py STEP CASE FOLDER [SOURCE]``.

Steps (the journey tier, ``tests/test_journeys.py``, runs each with the interpreter of the environment it tests):

- ``save``: for each of the comma-separated CASE names, build the case's small seeded model, save it dense to
  ``FOLDER/<case>/dense``, compress it, save it to ``FOLDER/<case>/compressed`` and write the outputs a user would
  compare to ``FOLDER/<case>/reference.pt``;
- ``native``: ``import hf_tensorcompress``, then load ``SOURCE`` (default ``FOLDER/compressed``, FOLDER being the
  case's folder) with the base class,
  ``AutoModel`` and the task Auto class, as an inference script does;
- ``remote``: load ``SOURCE`` with ``trust_remote_code=True`` where ``import hf_tensorcompress`` fails (a folder or
  a Hub repo id);
- ``compress-on-load``: ``from_pretrained(FOLDER/dense, quantization_config=CompressionConfig(...))``.

Loading steps print one JSON line ``{"loaded": [...]}`` and exit 0 when every output equals the saved model's; a
mismatch raises. This file imports only torch and transformers at the top, so it runs where the library is absent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from helpers import BLOCK_LIBRARY

GREEDY = dict(max_new_tokens=6, do_sample=False)
#: Every method and storage option a checkpoint can hold: ``family`` (the model), ``config`` (CompressionConfig
#: fields), ``torchao`` (the other Linear weights torchao int8, ``quantize_linears``).
CASES: dict[str, dict] = {
    "cp": {"family": "patchtst", "config": {"method": "cp", "rank": 3, "cp_iterations": 5}},
    "cp-factor-bits": {
        "family": "patchtst",
        "config": {"method": "cp", "rank": 3, "cp_iterations": 5, "factor_bits": 8},
    },
    "svd": {"family": "patchtst", "config": {"method": "svd", "rank": 4}},
    "svd-factor-bits": {"family": "patchtst", "config": {"method": "svd", "rank": 4, "factor_bits": 4}},
    "biprop": {"family": "patchtst", "config": {"method": "biprop", "keep_ratio": 0.5, "target_modules": "all-linear"}},
    "lowbit": {"family": "patchtst", "config": {"method": "lowbit", "weight_bits": 2, "weight_group_size": 16}},
    "lowbit-ternary": {
        "family": "patchtst",
        "config": {"method": "lowbit", "weight_bits": "ternary", "weight_group_size": 32},
    },
    "mixed": {
        "family": "patchtst",
        "config": {
            "method": "mixed",
            "forms": {
                "q_proj": {"method": "lowbit", "weight_bits": 2, "weight_group_size": 16},
                "k_proj": {"method": "svd", "rank": 4, "factor_bits": 4, "factor_group_size": 4},
                "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
                "out_proj": {"method": "cp", "rank": 3, "cp_iterations": 5, "factor_bits": "ternary"},
            },
        },
    },
    "tt": {"family": "llama", "config": {"method": "tt", "tt_shape": [4, 4, 4], "tt_ranks": 3}},
    "tt-storage-bits": {
        "family": "llama",
        "config": {"method": "tt", "tt_shape": [4, 4, 4], "tt_ranks": 3, "tt_storage_bits": 8},
    },
    "tiered": {
        "family": "llama",
        "config": {"method": "tiered", "tier_tokens": [32], "tier_bits": [8, 4], "tier_group_size": 32},
    },
    "tiered-codebook": {
        "family": "llama",
        "config": {
            "method": "tiered",
            "tier_tokens": [32],
            "tier_bits": [4, "codebook"],
            "tier_group_size": 32,
            "codebook_size": 256,
        },
    },
    "tiered-torchao": {
        "family": "llama",
        "config": {"method": "tiered", "tier_tokens": [32], "tier_bits": [8, 4], "tier_group_size": 32},
        "torchao": True,
    },
}
TASK_CLASS = {"patchtst": "PatchTSTForPrediction", "llama": "LlamaForCausalLM"}
TASK_AUTO = {"llama": "AutoModelForCausalLM"}  # transformers maps no Auto class to PatchTSTForPrediction


def build(family: str) -> torch.nn.Module:
    """The case's dense model, seeded."""
    torch.manual_seed(0)
    if family == "patchtst":
        config = transformers.PatchTSTConfig(
            num_input_channels=3, context_length=32, prediction_length=8, patch_length=8, patch_stride=8,
            d_model=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=64,
        )  # fmt: skip
        return transformers.PatchTSTForPrediction(config).eval()
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def inputs_of(family: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if family == "patchtst":
        return torch.randn(2, 32, 3, generator=generator)
    return torch.randint(2, 256, (2, 9), generator=generator)


@torch.no_grad()
def outputs(model: torch.nn.Module, family: str, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a user reads from ``model``: a task model's forecast or logits (and greedy tokens), a base model's
    hidden states."""
    if type(model).__name__.endswith(("ForPrediction", "ForCausalLM")):
        if family == "patchtst":
            return {"task": model(past_values=inputs).prediction_outputs}
        return {"task": model(inputs).logits, "generate": model.generate(inputs[:1], **GREEDY)}
    key = "past_values" if family == "patchtst" else "input_ids"
    return {"base": model(**{key: inputs}).last_hidden_state}


def compare(model: torch.nn.Module, family: str, reference: dict, how: str) -> str:
    """Raise unless ``model``'s outputs equal the saved model's; returns a line naming what was compared."""
    got = outputs(model, family, reference["inputs"])
    for key, value in got.items():
        expected = reference[key]
        if value.shape != expected.shape or not torch.equal(value, expected):
            difference = (
                (value.float() - expected.float()).abs().max().item() if value.shape == expected.shape else None
            )
            raise AssertionError(f"{how}: {key} differs from the saved model's (max |difference| {difference})")
    return f"{how} -> {type(model).__name__}: {sorted(got)} equal"


def save(case: dict, folder: Path) -> None:
    import hf_tensorcompress as library

    model = build(case["family"])
    model.save_pretrained(folder / "dense")
    library.apply_compression(model, library.CompressionConfig(**case["config"]))
    if case.get("torchao"):
        from torchao.quantization import IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerAxis

        linears = transformers.TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))
        library.quantize_linears(model, linears)
    inputs = inputs_of(case["family"])
    reference = {"inputs": inputs, **outputs(model, case["family"], inputs)}
    reference.update(outputs(model.get_submodule(model.base_model_prefix), case["family"], inputs))
    model.save_pretrained(folder / "compressed")
    torch.save(reference, folder / "reference.pt")


def load(case: dict, folder: Path, source: str, how: str) -> list[str]:
    """Load ``source`` every way a user of environment ``how`` would, comparing each model's outputs."""
    family, reference = case["family"], torch.load(folder / "reference.pt")
    task = getattr(transformers, TASK_CLASS[family])
    autos = ["AutoModel", *([TASK_AUTO[family]] if family in TASK_AUTO else [])]
    lines = []
    if how == "native":
        import hf_tensorcompress  # noqa: F401  (what makes transformers load compressed checkpoints natively)

        lines.append(compare(task.from_pretrained(source), family, reference, task.__name__))
        if case.get("torchao"):  # transformers 5.24 loads no torchao checkpoint of a causal LM into its base model
            autos.remove("AutoModel")
        for auto in autos:
            lines.append(compare(getattr(transformers, auto).from_pretrained(source), family, reference, auto))
    elif how == "remote":
        for auto in autos:
            model = getattr(transformers, auto).from_pretrained(source, trust_remote_code=True)
            lines.append(compare(model, family, reference, f"{auto}(trust_remote_code=True)"))
    else:  # compress-on-load
        from hf_tensorcompress import CompressionConfig

        torch.manual_seed(0)
        model = task.from_pretrained(folder / "dense", quantization_config=CompressionConfig(**case["config"]))
        lines.append(compare(model.eval(), family, reference, "from_pretrained(dense, quantization_config=...)"))
    return lines


def main(step: str, name: str, folder: str, source: str | None = None) -> None:
    if step == "save":  # NAME: comma-separated cases, each saved into FOLDER/<case>
        for case in name.split(","):
            (Path(folder) / case).mkdir(parents=True, exist_ok=True)
            save(CASES[case], Path(folder) / case)
        return
    case, folder = CASES[name], Path(folder)
    if step == "remote":  # ``import hf_tensorcompress`` fails from here on, as on a machine without it
        exec(BLOCK_LIBRARY)  # noqa: S102 - the tests' shared blocker
    print(json.dumps({"loaded": load(case, folder, source or str(folder / "compressed"), step)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
