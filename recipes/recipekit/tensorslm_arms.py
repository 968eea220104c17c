"""The TensorSLM sweep's arm catalogue: the TT settings of each ``--sweep`` and the simple baselines each tied TT
run is followed by at (at most) its parameter count."""

from __future__ import annotations

import torch

from hf_tensorcompress.methods.tt.baselines import dense_rows_svd_tail, frequency_only, rows_for_budget, tail_rank_for
from hf_tensorcompress.methods.tt.calibration import exact_token_ids
from hf_tensorcompress.methods.tt.energy import apply_svd_embedding, svd_rank_for

#: (name, tt_shape, tt_ranks, tt_eps, untied output, tt_basis[, tt_exact_tokens[, healed]]) — hidden size 576
#: (SmolLM2); ratios are per token train. ``healed`` runs ``heal_tt_embedding`` (--heal-steps) after compressing.
SWEEPS = {
    "smollm2": [
        ("tt3-r7", [8, 8, 9], [7, 7], None, False, "identity"),  # 511 params/token, 1.13x
        ("tt3-r6", [8, 8, 9], [6, 6], None, False, "identity"),  # 390, 1.48x
        ("tt3-r5", [8, 8, 9], [5, 5], None, False, "identity"),  # 285, 2.02x
        ("tt3-r7-untied", [8, 8, 9], [7, 7], None, True, "identity"),
        ("tt3-r5-untied", [8, 8, 9], [5, 5], None, True, "identity"),
        ("tt3-r7-output", [8, 8, 9], [7, 7], None, False, "output"),  # + d² basis: 1.11x
        ("tt3-r5-output", [8, 8, 9], [5, 5], None, False, "output"),  # + d² basis: 1.97x
        ("tt3-r5-pca", [8, 8, 9], [5, 5], None, False, "pca"),
    ],
    "exact": [  # output-aware basis + the 2000 most frequent calibration tokens dense (2000·576 + d² counted)
        ("tt3-r54-output-exact2000", [8, 8, 9], [5, 4], None, False, "output", 2000),  # 2.16x
        ("tt3-r5-output-exact2000", [8, 8, 9], [5, 5], None, False, "output", 2000),  # 1.83x
        ("tt3-r4-output-exact2000", [8, 8, 9], [4, 4], None, False, "output", 2000),  # 2.64x
        ("tt3-r4-output-exact8000", [8, 8, 9], [4, 4], None, False, "output", 8000),  # 1.95x
    ],
    "exact8000": [("tt3-r4-output-exact8000", [8, 8, 9], [4, 4], None, False, "output", 8000)],
    "exact14000": [("tt3-r3-output-exact14000", [8, 8, 9], [3, 3], None, False, "output", 14000)],  # 1.96x
    # every token seen in the calibration text dense (14,434 for Moby Dick's first 75%), the rest at ranks 3,2
    # the most frequent tokens dense (calibration counts, then token id order), the rest at rank 1; then healed
    "healed": [
        ("tt3-r11-output-exact21500", [8, 8, 9], [1, 1], None, False, "output", 21500),  # 2.03x
        ("tt3-r11-output-exact21500-healed", [8, 8, 9], [1, 1], None, False, "output", 21500, True),
        ("tt3-r5-healed", [8, 8, 9], [5, 5], None, False, "identity", 0, True),  # 2.02x, plain TT healed
    ],
    "orders": [
        ("tt2-r6", [24, 24], [6], None, False, "identity"),  # 288, 2.0x
        ("tt3-r4", [8, 8, 9], [4, 4], None, False, "identity"),  # 196, 2.94x
        ("tt4-r464", [4, 4, 6, 6], [4, 6, 4], None, False, "identity"),  # 280, 2.06x
    ],
    "smoke": [
        ("tt3-r5", None, [5, 5], None, False, "identity"),
        ("tt3-r5-untied", None, [5, 5], None, True, "identity"),
        ("tt3-r5-output", None, [5, 5], None, False, "output"),
        ("tt3-r5-output-exact64-healed", None, [5, 5], None, False, "output", 64, True),
    ],
}


def baselines(
    name: str, params: int, exact: int, basis: str, calibration_ids: torch.Tensor, vocab: int, hidden: int, args
) -> list[tuple]:
    """(label, method, build(model, covariance) → parameters) of the baselines at (at most) ``params``: matrix SVD,
    frequency-only with the calibration counts, and for a run with ``exact`` dense rows the same rows + an SVD of
    the other rows (output-aware, i.e. of ``W C^{1/2}``, when the run's basis is; ``covariance`` is then given)."""
    counts = torch.bincount(calibration_ids, minlength=vocab)[:vocab]
    rank, keep = svd_rank_for(vocab, hidden, params), rows_for_budget(hidden, params)
    runs = [] if args.no_svd else [(f"svd-k{rank}", "svd", lambda model, _: apply_svd_embedding(model, rank))]
    if args.no_baselines:
        return runs
    if keep < vocab:
        runs.append(
            (
                f"freq-only{keep}",
                "frequency-only",
                lambda model, _: frequency_only(model, exact_token_ids(counts, keep)),
            )
        )
    if exact and params - exact * hidden >= vocab - exact + hidden:
        tail = tail_rank_for(vocab, hidden, exact, params)
        runs.append(
            (
                f"rows{exact}+svd{tail}{'-output' if basis == 'output' else ''}",
                "rows+svd",
                lambda model, covariance: dense_rows_svd_tail(model, exact_token_ids(counts, exact), tail, covariance),
            )
        )
    return runs
