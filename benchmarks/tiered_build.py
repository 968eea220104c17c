"""What a ``size_ratio`` build costs as the model grows, and how fast the built head and lookup serve many positions.

    OMP_NUM_THREADS=2 python benchmarks/tiered_build.py [--shapes smollm2 262k 1b] [--size-ratio 4]
        [--calibration-tokens 8192] [--positions 512] [--dtype fp32|bf16] [--device cpu|cuda] [--float32-build]

Shapes: ``smollm2`` is SmolLM2-135M from the cached assets (49,152 × 576 tied embedding, 30 layers); ``262k`` a
random-initialised Gemma 3 causal LM of the 270M class (262,144 × 640, 18 layers, √d-scaled embedding); ``1b`` a
random-initialised Llama of the 1B class (128,256 × 2,048, 16 layers). Random weights serve for time and memory,
not quality (quality is in ``recipes/tensorslm_domains.py``'s results). Calibration text is the first
``--calibration-tokens`` tokens of Moby Dick's build split in SmolLM2's tokenizer (spread over the larger
vocabularies by a fixed multiplier, so the counts touch the whole table).

Each shape runs in two new processes: one times the dense forward, the other loads the model and builds it the way a
user does (a forward with full logits before the build would leave its freed blocks on the C heap and inflate the
build's memory), so its memory figures are that build's alone:

- ``forward_s``: one forward pass of the dense model over the calibration tokens (512-token windows, full logits): the
  unit of the build's cost;
- ``build_s``: ``apply_tiered(model, CompressionConfig(method="tiered", size_ratio=…, rounding="output"), ids)``
  with every default (the model's own text, the held-back check), and ``build_over_forward``; the steps apart:
  the calibration pass, the model's own text, every row at every width, storing the chosen rows (the allocation
  and the one weighed alike) and the held-back check;
- ``build_peak_rss_mb``: the process's peak resident memory during the build (``VmHWM`` reset before it), against
  the model's fp32 bytes (parameters, buffers) as ``build_peak_over_fp32_model``; ``build_added_over_fp32_model`` is
  what the build added to the resident size it started from (the loaded model, every weight read once so that a
  memory-mapped checkpoint is resident, the imported libraries), and
  ``<step>_peak_added_mb`` what each step added at its peak over the size it started at (where the memory goes);
  ``process_peak_over_fp32_model`` the whole process's peak (loading the model, the libraries, the build);
- ``head_speed``: dense fp32 ``F.linear`` time / tiered ``logits`` time for ``--positions`` hidden states at batch 1
  and at batch 8 (8 × positions/8), and for one hidden state (a decoding step); ``lookup_speed`` the same for the
  embedding lookup of those positions (both called as modules, as the model calls them; the dense arm an
  ``nn.Embedding`` of the table, multiplied by the model's embedding scale where it has one, as its module does),
  and ``lookup_batch8_full`` for 8 prompts of ``--positions`` tokens each (a batch's prefill); ``…_cold`` the
  lookups of one prompt and of the 8 prompts with 128 MB read before each call, as a forward pass meets them (its
  layers' weights have pushed the table's rows out of the caches), where a repeated lookup finds them cached;
  these draw token ids uniformly, so most rows are of the narrowest tier; ``lookup_text_…`` the same lookups (one
  prompt, 8 prompts, warm and cold) of Moby Dick's held-out text, whose tokens reach the tiers as a user's do;
  ``model_prefill`` / ``model_scoring`` the same for the whole model over one prompt of ``--positions`` calibration
  tokens, its logits at the last position (``generate()``'s prefill) or at every one (scoring), against the dense
  model built again. Above 1: the tiered layer is faster. Pairs run alternately, best of ``--repeats``.

A bf16 model builds in bf16 on a CPU with bf16 units and in float32 on one without (``core.float32_build``);
``--float32-build`` builds in float32 on either, the comparison for the first (``build_dtype`` in the output).

The last line printed is one JSON object with every figure. Targets (2 idle cores): SmolLM2 build ≤ 3 min, 262k ≤ 10
min, 1B ≤ 30 min; peak RSS ≤ 1.5× the fp32 model; head and lookup at many positions ≥ 1.0× dense.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import add_device_arguments, device_and_dtype, side_by_side  # noqa: E402

SHAPES = ("smollm2", "262k", "1b")
TARGET_MINUTES = {"smollm2": 3, "262k": 10, "1b": 30}
WINDOW = 512

#: Bytes read before each cold lookup: several times a last-level cache (32 MB on the AMD EPYC these figures ran on).
EVICTION_BYTES = 128 * 2**20


def model_of(shape: str) -> torch.nn.Module:
    """A dense fp32 causal LM of ``shape`` (module docstring)."""
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig

    if shape == "smollm2":
        from hf_tensorcompress.data.causal_lm import smollm2_dir

        return AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    torch.manual_seed(0)
    if shape == "262k":
        config = Gemma3TextConfig(
            vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32_768,
            sliding_window=512, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        )  # fmt: skip
        return Gemma3ForCausalLM(config)
    config = LlamaConfig(
        vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131_072, tie_word_embeddings=True, bos_token_id=128_000,
        eos_token_id=128_001,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def moby_dick_ids(tokens: int, vocab: int, held_out: bool = False) -> torch.Tensor:
    """The first ``tokens`` tokens of Moby Dick's build split (``held_out``: of its held-out split, text the build
    never saw) in SmolLM2's tokenizer, spread over ``vocab``."""
    from transformers import AutoTokenizer

    from hf_tensorcompress import assets
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    build, held_back = split_documents(text_dataset(assets.moby_dick_dir()), 0.25)
    ids = token_ids(tokenizer, held_back if held_out else build, tokens).reshape(-1)
    return ids * max(1, vocab // len(tokenizer))


@torch.no_grad()
def forward_seconds(model: torch.nn.Module, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    for first in range(0, len(ids), WINDOW):
        model(input_ids=ids[first : first + WINDOW][None].to(model.device))
    return time.perf_counter() - start


def status_mb(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, in MB."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    """Start ``VmHWM`` over from the current resident size (Linux: ``/proc/self/clear_refs``), so the build's own
    peak is measured apart from loading and the forward pass before it."""
    Path("/proc/self/clear_refs").write_text("5")


@torch.no_grad()
def speeds(
    layer, dense: torch.Tensor, scale: float | None, text: torch.Tensor, device: torch.device, repeats: int
) -> dict:
    """Dense time / tiered time of the head and the lookup at ``positions`` (``text``'s width; batch 1 and 8) and at
    one position, and of the lookup of 8 × ``positions`` tokens; the lookups' milliseconds beside (both are small
    next to one layer of the model). Token ids drawn uniformly reach every tier by its share of the vocabulary (most
    rows the narrowest); ``text`` (8 prompts of unseen text) reaches them as a user's prompts do. ``scale``: the
    dense model's embedding scale (Gemma's √d), which its lookup multiplies by as the tiered one does."""
    positions = text.shape[1]
    generator = torch.Generator().manual_seed(0)
    factor = None if scale is None else torch.tensor(scale, dtype=torch.float32).to(device, dense.dtype)
    embedding = torch.nn.Embedding.from_pretrained(dense, freeze=True)  # the same tensor, called as a module

    def dense_lookup(tokens: torch.Tensor) -> torch.Tensor:  # the replaced module, called as the model calls it
        vectors = embedding(tokens)
        return vectors if factor is None else vectors * factor

    def lookup_speed(key: str, tokens: torch.Tensor, before: Callable[[], object] | None = None) -> None:
        """``result[key]`` (dense time / tiered time) and ``result[key + "_ms"]`` for the lookup of ``tokens``."""
        dense_s, tiered_s = side_by_side(lambda: dense_lookup(tokens), lambda: layer(tokens), device, repeats, before)
        result[key] = dense_s / tiered_s
        result[f"{key}_ms"] = {"dense": 1e3 * dense_s, "tiered": 1e3 * tiered_s}

    hidden = torch.randn(positions, dense.shape[1], generator=generator).to(device, dense.dtype)
    ids = torch.randint(0, dense.shape[0], (positions,), generator=generator).to(device)
    result = {}
    for name, shape in (("batch1", (1, positions)), ("batch8", (8, positions // 8)), ("one", (1, 1))):
        states, tokens = hidden[: shape[0] * shape[1]].reshape(*shape, -1), ids[: shape[0] * shape[1]].reshape(shape)
        dense_s, tiered_s = side_by_side(
            lambda states=states: F.linear(states, dense), lambda states=states: layer.logits(states), device, repeats
        )
        result[f"head_{name}"] = dense_s / tiered_s
        lookup_speed(f"lookup_{name}", tokens)
    prompts = torch.randint(0, dense.shape[0], (8, positions), generator=generator).to(device)
    lookup_speed("lookup_batch8_full", prompts)  # 8 prompts of ``positions``: the prefill of a batch
    # the same lookups from cold caches, as a forward pass meets them: every layer's weights have gone through the
    # caches since the model's last lookup, where a repeated lookup finds the rows it read last time still there
    streamed = torch.ones(EVICTION_BYTES // 4, device=device)
    lookup_speed("lookup_batch1_cold", ids[None], before=streamed.sum)
    lookup_speed("lookup_batch8_full_cold", prompts, before=streamed.sum)
    text = text.to(device)
    lookup_speed("lookup_text_batch1", text[:1])
    lookup_speed("lookup_text_batch8_full", text)
    lookup_speed("lookup_text_batch1_cold", text[:1], before=streamed.sum)
    lookup_speed("lookup_text_batch8_full_cold", text, before=streamed.sum)
    return result


#: The build's steps timed apart (``module:function`` → name in the JSON).
PHASES = {
    "hf_tensorcompress.methods.tt.calibration:hidden_covariance": "calibration_pass_s",
    "hf_tensorcompress.methods.tiered.apply:sample_model_text": "model_text_s",
    "hf_tensorcompress.methods.tiered.budget_tiers:measure_widths": "measure_widths_s",
    "hf_tensorcompress.methods.tiered.budget_tiers:allocation_layer": "store_rows_s",
    "hf_tensorcompress.methods.tiered.budget_tiers:compare": "held_back_check_s",
}


def time_phases() -> dict[str, float]:
    """Wrap each of ``PHASES`` so its calls add their seconds to the returned dict, and the most resident memory
    any of its calls added over the size it started at (``<phase>_peak_added_mb``, ``VmHWM`` reset at each call)."""
    import importlib

    seconds = dict.fromkeys(PHASES.values(), 0.0)
    seconds.update({name.removesuffix("_s") + "_peak_added_mb": 0.0 for name in PHASES.values()})
    seconds["build_peak_rss_mb"] = 0.0  # the build's peak, kept across the resets
    for path, name in PHASES.items():
        module_name, function_name = path.split(":")
        module = importlib.import_module(module_name)
        function = getattr(module, function_name)

        def timed(*args, _function=function, _name=name, **kwargs):
            seconds["build_peak_rss_mb"] = max(seconds["build_peak_rss_mb"], status_mb("VmHWM"))
            reset_peak()
            start, resident = time.perf_counter(), status_mb("VmRSS")
            try:
                return _function(*args, **kwargs)
            finally:
                seconds[_name] += time.perf_counter() - start
                peak = _name.removesuffix("_s") + "_peak_added_mb"
                seconds[peak] = max(seconds[peak], status_mb("VmHWM") - resident)
                seconds["build_peak_rss_mb"] = max(seconds["build_peak_rss_mb"], status_mb("VmHWM"))

        setattr(module, function_name, timed)
    return seconds


def forward_part(args: argparse.Namespace) -> dict:
    """One shape's dense forward over the calibration tokens, in this process."""
    device, dtype = device_and_dtype(args)
    model = model_of(args.shape).to(device, dtype).eval()
    ids = moby_dick_ids(args.calibration_tokens, model.get_input_embeddings().num_embeddings)
    forward_s = forward_seconds(model, ids)
    print(f"{args.shape}: one forward over {len(ids):,} tokens {forward_s:.1f} s", file=sys.stderr, flush=True)
    return {"forward_s": forward_s}


@torch.no_grad()
def page_in(model: torch.nn.Module) -> None:
    """Read every weight once. ``from_pretrained`` maps the safetensors file, and its pages become resident only when
    something first reads them: on SmolLM2 the build's calibration pass would count the model's own 0.5 GB as the
    build's memory."""
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.sum()


def build_part(args: argparse.Namespace) -> dict:
    """One shape loaded and built, in this process: build time, peak RSS, speeds. The dense table the speeds
    compare against waits on disk during the build, so it is not part of the build's memory."""
    from hf_tensorcompress import CompressionConfig, apply_tiered
    from hf_tensorcompress.core import float32_build

    device, dtype = device_and_dtype(args)
    model = model_of(args.shape).to(device, dtype).eval()
    page_in(model)
    model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    fp32_bytes = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    vocab = model.get_input_embeddings().num_embeddings
    scale = getattr(model.get_input_embeddings(), "embed_scale", None)
    scale = None if scale is None else float(scale)
    ids = moby_dick_ids(args.calibration_tokens, vocab)
    config = CompressionConfig(method="tiered", size_ratio=args.size_ratio, rounding="output")
    with float32_build.forced_float32(args.float32_build):
        cast = float32_build.float32_dtypes()
    with tempfile.TemporaryDirectory() as folder:
        dense_file = Path(folder) / "dense.pt"
        torch.save(model.get_input_embeddings().weight.detach().cpu(), dense_file)
        process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        phases = time_phases()
        reset_peak()
        before = status_mb("VmRSS")
        start = time.perf_counter()
        with float32_build.forced_float32(args.float32_build):
            apply_tiered(model, config, ids.to(device))
        build_s = time.perf_counter() - start
        peak = max(status_mb("VmHWM"), phases.pop("build_peak_rss_mb"))
        whole_peak = max(process_peak, peak)
        dense = torch.load(dense_file).to(device, dtype)
    layer = model.get_input_embeddings()
    check = getattr(layer, "budget_check", None)
    text = moby_dick_ids(8 * args.positions, vocab, held_out=True).reshape(8, args.positions)
    return {
        "shape": args.shape,
        "vocab": vocab,
        "hidden": dense.shape[1],
        "layers": model.config.num_hidden_layers,
        "dtype": args.dtype,
        "build_dtype": "fp32" if device.type == "cpu" and dtype in cast else args.dtype,
        "calibration_tokens": len(ids),
        "build_s": build_s,
        **phases,
        "target_minutes": TARGET_MINUTES[args.shape],
        "model_mb": model_bytes / 2**20,
        "fp32_model_mb": fp32_bytes / 2**20,
        "rss_before_build_mb": before,
        "build_peak_rss_mb": peak,
        "build_peak_over_fp32_model": peak * 2**20 / fp32_bytes,
        "build_added_over_fp32_model": (peak - before) * 2**20 / fp32_bytes,
        "peak_before_build_mb": process_peak,
        "process_peak_over_fp32_model": whole_peak * 2**20 / fp32_bytes,
        "stored_bytes": layer.storage_bits() // 8,
        "kept": check.kept if check else None,
        "embed_scale": scale,
        **speeds(layer, dense, scale, text, device, args.repeats),
        **whole_model_speeds(model, args.shape, ids[: args.positions], device, dtype, args.repeats),
    }


@torch.no_grad()
def whole_model_speeds(
    model: torch.nn.Module, shape: str, ids: torch.Tensor, device: torch.device, dtype: torch.dtype, repeats: int
) -> dict:
    """Dense time / tiered time of the whole model over one prompt of ``ids`` (what a user waits for): its prefill
    (every layer, the lookup, and the head at the last position, as ``generate()`` runs it) and its scoring (the
    head at every position). The dense model is the same one built again (the same seed, or the same files)."""
    dense_model = model_of(shape).to(device, dtype).eval()
    tokens = ids[None].to(device)
    result = {}
    for name, keep in (("prefill", 1), ("scoring", 0)):
        dense_s, tiered_s = side_by_side(
            lambda keep=keep: dense_model(input_ids=tokens, logits_to_keep=keep),
            lambda keep=keep: model(input_ids=tokens, logits_to_keep=keep),
            device,
            repeats,
        )
        result[f"model_{name}"] = dense_s / tiered_s
        result[f"model_{name}_ms"] = {"dense": 1e3 * dense_s, "tiered": 1e3 * tiered_s}
    return result


def run_part(shape: str, part: str, args: argparse.Namespace) -> dict:
    """``part`` of ``shape`` in a new process (its memory its own); its last line's JSON."""
    command = [sys.executable, __file__, "--shape", shape, "--part", part, "--dtype", args.dtype]
    command += ["--device", args.device, "--size-ratio", str(args.size_ratio)]
    command += ["--calibration-tokens", str(args.calibration_tokens)]
    command += ["--positions", str(args.positions), "--repeats", str(args.repeats)]
    command += ["--float32-build"] if args.float32_build else []
    output = subprocess.run(command, check=True, capture_output=True, text=True)
    sys.stderr.write(output.stderr[-4000:])
    return json.loads(output.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--shape", choices=SHAPES, help=argparse.SUPPRESS)  # one shape, in this process
    parser.add_argument("--part", choices=("forward", "build"), default="build", help=argparse.SUPPRESS)
    parser.add_argument("--size-ratio", type=float, default=4.0)
    parser.add_argument("--calibration-tokens", type=int, default=8192)
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--float32-build", action="store_true", help="build a bf16 model in float32 even on a CPU with bf16 units"
    )
    add_device_arguments(parser)
    args = parser.parse_args(argv)
    if args.shape:
        result = (forward_part if args.part == "forward" else build_part)(args)
        print(json.dumps(result))
        return result
    results = {"threads": torch.get_num_threads(), "dtype": args.dtype, "device": args.device, "shapes": []}
    for shape in args.shapes:
        forward_s = run_part(shape, "forward", args)["forward_s"]
        built = run_part(shape, "build", args)
        figures = {**built, "forward_s": forward_s, "build_over_forward": built["build_s"] / forward_s}
        print({key: round(value, 3) if isinstance(value, float) else value for key, value in figures.items()})
        results["shapes"].append(figures)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
