"""Optional healing of a tied TT embedding by distillation from the dense model at the output layer (TensorSLM).

TT compression itself stays training-free; this is a short, explicit extra step. Measured on SmolLM2, the tied
output layer is where per-token TT breaks (PPL ×8-1700 tied against ×1.4-16 with a dense untied head): tokens
whose compressed vectors give too large logits take probability mass from the right ones. So the cores learn to
reproduce the dense model's next-token distributions *given the dense model's final hidden states*: the KL
divergence of ``softmax(h Ŵᵀ)`` from ``softmax(h Wᵀ)``. Only the output product is in the graph (no transformer
forward or backward per step; on SmolLM2 that product is about a fifth of a forward), and the teacher runs once.
Everything but the TT cores (transformer, output-aware basis, exact rows) stays frozen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .head import TTTiedHead
from .layer import TTEmbedding


@torch.no_grad()
def final_hidden_states(model: nn.Module, token_ids: torch.Tensor, window: int = 256) -> torch.Tensor:
    """``(n, d)`` hidden states entering the output layer for the tokens of ``token_ids`` (windows of ``window``).

    Runs the model's decoder alone (its ``last_hidden_state`` is what the head reads): the full model would also
    compute every window's logits over the whole vocabulary, a fifth of SmolLM2's forward, only to discard them."""
    model.eval()
    decoder = model.get_decoder()
    device = next(model.parameters()).device
    states = []
    for start in range(0, len(token_ids), window):
        chunk = token_ids[start : start + window].to(device)[None]
        states.append(decoder(input_ids=chunk).last_hidden_state[0].float())
    return torch.cat(states)


def heal_tt_embedding(
    student: nn.Module,
    teacher: nn.Module,
    token_ids: torch.Tensor,
    *,
    steps: int = 100,
    tokens_per_step: int = 512,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Distil ``teacher``'s output distributions into the TT cores of ``student``'s tied embedding.

    Args:
        student: a model compressed with ``method="tt"`` whose output layer is the tied ``TTTiedHead``.
        teacher: the dense model it was compressed from.
        token_ids: calibration text, never the evaluation text; its hidden states are computed once.
        steps: Adam steps, each on ``tokens_per_step`` hidden states drawn at random (seeded by ``seed``).

    Returns the mean per-token KL of every step. The cores are updated in place.
    """
    layer, head = student.get_input_embeddings(), student.get_output_embeddings()
    if not isinstance(layer, TTEmbedding) or not isinstance(head, TTTiedHead):
        raise ValueError(
            "heal_tt_embedding needs a model compressed with method='tt' and a tied output layer (TTTiedHead); got "
            f"input {type(layer).__name__}, output {type(head).__name__} (tt_untie_output=True keeps a dense head: "
            "nothing to heal there)"
        )
    if layer.code_bits is not None:
        raise ValueError(
            f"heal_tt_embedding trains float cores; this embedding stores {layer.code_bits}-bit codes. Compress without "
            "tt_storage_bits, heal, then call get_input_embeddings().store_codes(bits, group_size)"
        )
    if steps < 1 or tokens_per_step < 1:
        raise ValueError(f"steps and tokens_per_step must be >= 1, got {steps} and {tokens_per_step}")
    hidden = final_hidden_states(teacher, token_ids.reshape(-1))
    dense_head = teacher.get_output_embeddings()
    cores = list(layer.cores)
    was_trainable = [core.requires_grad for core in cores]
    for core in cores:
        core.requires_grad_(True)
    optimizer = torch.optim.Adam(cores, lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    try:
        for _ in tqdm(range(steps), desc="heal TT cores", disable=not progress):
            rows = hidden[torch.randint(len(hidden), (tokens_per_step,), generator=generator)].to(cores[0].device)
            with torch.no_grad():
                target = F.log_softmax(dense_head(rows).float(), dim=-1)
            student_logits = F.log_softmax(layer.logits(rows).float(), dim=-1)
            loss = F.kl_div(student_logits, target, log_target=True, reduction="batchmean")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        for core, trainable in zip(cores, was_trainable):
            core.requires_grad_(trainable)
    return losses
