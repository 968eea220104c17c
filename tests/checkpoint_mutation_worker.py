"""Child process of tests/test_checkpoint_mutation.py: applies each mutation of a job file to a copy of a saved
checkpoint, loads it, runs it, and prints one JSON line per mutation (flushed, so the parent knows which mutation a
crash interrupted).

``python checkpoint_mutation_worker.py native|remote JOBS.json WORK_DIR``. ``native``: ``import hf_tensorcompress``
then ``AutoModelForCausalLM.from_pretrained``; ``remote``: hf_tensorcompress cannot be imported (a ``sys.meta_path``
blocker, as on a machine without it) and the load takes ``trust_remote_code=True``. Outcomes: ``refused`` (the
library's CompressedCheckpointError), ``equal`` (outputs equal the original's), ``different``, ``load_error`` /
``run_error`` (any other exception, at load or in the forward). Imports torch, transformers and safetensors only.
"""

from __future__ import annotations

import sys


class _BlockLibrary:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_tensorcompress" or name.startswith("hf_tensorcompress."):
            raise ImportError("hf_tensorcompress is not installed here (blocked by the test)")
        return None


MODE = sys.argv[1]
if MODE == "remote":
    sys.meta_path.insert(0, _BlockLibrary())

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

if MODE == "native":
    import hf_tensorcompress  # noqa: F401

hf_logging.set_verbosity_error()
torch.set_num_threads(1)
WEIGHTS = "model.safetensors"


def apply_tensor(tensors: dict[str, torch.Tensor], mutation: dict) -> None:
    op, key = mutation["op"], mutation.get("key")
    if op == "delete":
        del tensors[key]
    elif op == "add":
        tensors[key] = torch.zeros(mutation["shape"], dtype=getattr(torch, mutation["dtype"]))
    elif op == "dtype":
        tensors[key] = tensors[key].to(getattr(torch, mutation["dtype"]))
    elif op == "shape":
        tensor, how = tensors[key], mutation["how"]
        if how == "drop_row":
            tensors[key] = tensor[:-1].clone()
        elif how == "add_row":
            tensors[key] = torch.cat([tensor, tensor[-1:]])
        elif how == "flatten":
            tensors[key] = tensor.reshape(-1).clone()
        else:
            tensors[key] = tensor.unsqueeze(0).clone()
    elif op == "value":
        flat = tensors[key].reshape(-1).clone()
        value = mutation["value"]
        if value == "dup":  # the slot map with a duplicate row
            flat[1] = flat[0]
        elif value == "fill":  # a byte of packed bits whose count of ones changes
            flat[mutation["index"]] = 0 if int(flat[mutation["index"]]) == 255 else 255
        else:
            flat[mutation["index"]] = float(value) if isinstance(value, str) else value
        tensors[key] = flat.reshape(tensors[key].shape)


def apply_config(config: dict, mutation: dict) -> None:
    *path, last = mutation["path"]
    node = config
    for step in path:
        node = node[step]
    if mutation.get("delete"):
        del node[last]
    else:
        node[last] = mutation["value"]


def prepare(source: str, work: str, mutation: dict) -> None:
    """``work`` becomes a copy of ``source`` with ``mutation`` applied."""
    if os.path.isdir(work):
        shutil.rmtree(work)
    shutil.copytree(source, work)
    if mutation["op"] == "config":
        with open(os.path.join(work, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        apply_config(config, mutation)
        with open(os.path.join(work, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
    elif mutation["op"] != "none":
        with safe_open(os.path.join(source, WEIGHTS), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        apply_tensor(tensors, mutation)
        save_file(tensors, os.path.join(work, WEIGHTS), metadata=metadata)


def outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Logits at batch 2 (the chunked torch path) and batch 1 (the fused kernels), and a short greedy generation."""
    with torch.no_grad():
        return {
            "logits": model(inputs["batch"]).logits,
            "step": model(inputs["single"]).logits,
            "generated": model.generate(inputs["single"], max_new_tokens=2, do_sample=False),
        }


def same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    return all(
        got[name].shape == value.shape and torch.allclose(got[name], value, rtol=0, atol=1e-6, equal_nan=False)
        for name, value in expected.items()
    )


def run(job: dict, work: str) -> dict:
    mutation = job["mutation"]
    prepare(job["folder"], work, mutation)
    reference = torch.load(job["reference"])
    try:
        model = AutoModelForCausalLM.from_pretrained(work, trust_remote_code=MODE == "remote").eval()
    except Exception as error:  # noqa: BLE001  (every refusal is classified by the parent)
        name = type(error).__name__
        outcome = "refused" if name == "CompressedCheckpointError" else "load_error"
        return {"outcome": outcome, "error": f"{name}: {str(error)[:600]}"}
    try:
        got = outputs(model, reference["inputs"])
    except Exception as error:  # noqa: BLE001
        return {"outcome": "run_error", "error": f"{type(error).__name__}: {str(error)[:300]}"}
    return {"outcome": "equal" if same(got, reference["outputs"]) else "different"}


def main() -> None:
    with open(sys.argv[2], encoding="utf-8") as handle:
        jobs = json.load(handle)
    for job in jobs:
        try:
            result = run(job, os.path.join(sys.argv[3], "checkpoint"))
        except Exception:  # noqa: BLE001  (the harness itself failed: reported, not hidden)
            result = {"outcome": "harness_error", "error": traceback.format_exc()[-600:]}
        print(json.dumps({"id": job["id"], **result}), flush=True)


if __name__ == "__main__":
    main()
