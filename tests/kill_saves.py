"""SIGKILLs at random moments of ``save_pretrained`` over an existing folder (run by tests/test_atomic_save.py in its
own process, so nothing here can take pytest down).

``python kill_saves.py FOLDER MODES KILLS SEED`` keeps two compressed models (cp and svd: a config of one beside the
weights of the other cannot load). For each kill a forked child saves them over the target in turn, without end,
and is SIGKILLed after a random delay; then the target is loaded with the library (whose load recovers what a kill
left) and its output must be one of the two models'; then a save must leave no residue. MODES, comma-separated:
``exchange`` (the one-step swap), ``renames`` (the two-rename fallback), ``in-place`` (``save_pretrained(".")``).
Prints one JSON line of counts per mode; exits non-zero at the first failure.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from helpers import tiny_patchtst_config
from tqdm import tqdm
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.runtime import atomic


def compressed(method: str) -> PatchTSTForPrediction:
    torch.manual_seed(0)
    options = {"cp_iterations": 1} if method == "cp" else {}
    config = CompressionConfig(method=method, rank=2, **options)
    return apply_compression(PatchTSTForPrediction(tiny_patchtst_config()).eval(), config)


def output(model: PatchTSTForPrediction, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(past_values=inputs).prediction_outputs


def residue(target: Path) -> list[str]:
    beside = [name for name in os.listdir(target.parent) if name != target.name]
    inside = [name for name in os.listdir(target) if name.startswith(atomic.IN_PLACE)]
    return beside + inside


def kill_saves(models: list, folder: Path, mode: str, kills: int, rng: random.Random) -> dict:
    """``kills`` SIGKILLed saves over ``folder/model`` in ``mode``; the counts, or an ``error`` at the first failure."""
    target = folder / "model"
    inputs = torch.randn(2, models[0].config.context_length, models[0].config.num_input_channels)
    expected = [output(model, inputs) for model in models]
    save_as = "." if mode == "in-place" else str(target)
    target.mkdir(parents=True)
    os.chdir(target if mode == "in-place" else folder)
    started = time.monotonic()
    models[0].save_pretrained(save_as)
    save_seconds = time.monotonic() - started
    counts = {"mode": mode, "kills": 0, "loaded_old_or_new": 0, "recovered": 0, "missing_before_load": 0}
    for _ in range(kills):
        child = os.fork()
        if child == 0:  # saves the other model, then the first, ... until killed
            turn = 1
            while True:
                models[turn].save_pretrained(save_as)
                turn = 1 - turn
        time.sleep(rng.uniform(0, 3 * save_seconds))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        counts["kills"] += 1
        missing = not (target / "config.json").is_file()
        counts["missing_before_load"] += missing
        counts["recovered"] += missing or bool(residue(target))
        got = output(type(models[0]).from_pretrained(str(target)).eval(), inputs)
        if not any(torch.allclose(got, want, rtol=1e-5, atol=1e-6) for want in expected):
            return {"error": "loaded neither checkpoint", **counts}
        counts["loaded_old_or_new"] += 1
        models[rng.randrange(2)].save_pretrained(save_as)
        left = residue(target)
        if left:
            return {"error": f"residue after the next save: {left}", **counts}
    return {**counts, "save_ms": round(1000 * save_seconds)}


def main() -> int:
    folder, modes, kills, seed = Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)  # no thread pool for the forked children to inherit
    # tqdm's default lock is a process-shared semaphore: a child killed holding it would hang this process
    tqdm.set_lock(threading.RLock())
    models = [compressed("cp"), compressed("svd")]
    rng = random.Random(seed)
    exchange = atomic._exchange
    results = []
    for mode in modes:
        atomic._exchange = (lambda first, second: False) if mode == "renames" else exchange
        results.append(kill_saves(models, folder / mode, mode, kills, rng))
        if "error" in results[-1]:
            break
    print(json.dumps(results))
    return int(any("error" in result for result in results))


if __name__ == "__main__":
    sys.exit(main())
