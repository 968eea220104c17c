"""Shared test utilities: tiny models of every supported class, and a subprocess in which hf_tensorcompress cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from transformers import (
    AutoformerConfig,
    AutoformerForPrediction,
    GPT2Config,
    GPT2LMHeadModel,
    InformerConfig,
    InformerForPrediction,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PatchTSTConfig,
    PatchTSTForClassification,
    PatchTSTForPrediction,
    PatchTSTForPretraining,
    PatchTSTForRegression,
)

#: Put first on sys.meta_path in the child process: any import of hf_tensorcompress fails, as on a machine without it.
BLOCK_LIBRARY = textwrap.dedent(
    """
    import sys
    class _BlockLibrary:
        def find_spec(self, name, path=None, target=None):
            if name == "hf_tensorcompress" or name.startswith("hf_tensorcompress."):
                raise ImportError("hf_tensorcompress is not installed here (blocked by the test)")
            return None
    sys.meta_path.insert(0, _BlockLibrary())
    sys.path = [p for p in sys.path if p not in ("", ".")]
    """
)


def run_without_library(script: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python where ``import hf_tensorcompress`` raises ImportError."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_LIBRARY + textwrap.dedent(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def tiny_patchtst_config(**overrides) -> PatchTSTConfig:
    values = dict(
        num_input_channels=3,
        context_length=32,
        prediction_length=8,
        patch_length=8,
        patch_stride=8,
        d_model=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=64,
        num_targets=2,
    )
    values.update(overrides)
    return PatchTSTConfig(**values)


def _seq2seq_kwargs() -> dict:
    return dict(
        prediction_length=8,
        context_length=16,
        input_size=2,
        lags_sequence=[1, 2, 3],
        num_time_features=1,
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_layers=2,
        decoder_layers=1,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
    )


def tiny_time_series(family: str, informer_attention: str = "prob") -> torch.nn.Module:
    """One small seeded forecaster of ``family`` (patchtst, autoformer, informer), in eval mode."""
    torch.manual_seed(0)
    if family == "patchtst":
        return PatchTSTForPrediction(tiny_patchtst_config()).eval()
    if family == "autoformer":
        return AutoformerForPrediction(AutoformerConfig(**_seq2seq_kwargs())).eval()
    return InformerForPrediction(InformerConfig(**_seq2seq_kwargs(), attention_type=informer_attention)).eval()


LM_VOCAB, LM_HIDDEN = 120, 24


#: A Llama whose every Linear is a multiple of 32 wide and 64 deep: bitsandbytes' packed CPU kernel, which its 4-bit
#: Linears run in eval mode without gradients, takes no narrower ones.
WIDE_LLAMA = dict(hidden=64, intermediate=64)


def tiny_causal_lm(kind: str, tie: bool = True, hidden: int = LM_HIDDEN, intermediate: int = 32) -> torch.nn.Module:
    """A small seeded causal LM (llama, gpt2, opt) with tied embeddings by default, in eval mode (``hidden``,
    ``intermediate``: the Llama's widths)."""
    torch.manual_seed(0)
    common = dict(vocab_size=LM_VOCAB, bos_token_id=0, eos_token_id=1, tie_word_embeddings=tie)
    if kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=LM_HIDDEN, n_layer=2, n_head=2, n_positions=64, **common))
    elif kind == "opt":
        model = OPTForCausalLM(
            OPTConfig(
                hidden_size=LM_HIDDEN,
                num_hidden_layers=2,
                ffn_dim=32,
                num_attention_heads=2,
                max_position_embeddings=64,
                word_embed_proj_dim=LM_HIDDEN,
                pad_token_id=2,
                **common,
            )
        )
    else:
        model = LlamaForCausalLM(
            LlamaConfig(
                hidden_size=hidden,
                intermediate_size=intermediate,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                pad_token_id=2,
                **common,
            )
        )
    return model.eval()


def tiny_models() -> dict[str, torch.nn.Module]:
    """One small randomly initialised model of every supported class, in eval mode."""
    torch.manual_seed(0)
    models = {
        "PatchTSTForPrediction": PatchTSTForPrediction(tiny_patchtst_config()),
        "PatchTSTForClassification": PatchTSTForClassification(tiny_patchtst_config()),
        "PatchTSTForRegression": PatchTSTForRegression(tiny_patchtst_config()),
        "PatchTSTForPretraining": PatchTSTForPretraining(tiny_patchtst_config(do_mask_input=False)),
        "AutoformerForPrediction": AutoformerForPrediction(AutoformerConfig(**_seq2seq_kwargs())),
        "InformerForPrediction": InformerForPrediction(InformerConfig(**_seq2seq_kwargs(), attention_type="prob")),
        "InformerForPrediction-full": InformerForPrediction(InformerConfig(**_seq2seq_kwargs(), attention_type="full")),
    }
    return {name: model.eval() for name, model in models.items()}


def tiny_inputs(name: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Deterministic inputs for ``tiny_models()[name]``."""
    generator = torch.Generator().manual_seed(1)
    config = model.config
    if name.startswith("PatchTST"):
        return {"past_values": torch.randn(2, config.context_length, config.num_input_channels, generator=generator)}
    history = config.context_length + max(config.lags_sequence)
    return {
        "past_values": torch.randn(2, history, config.input_size, generator=generator),
        "past_time_features": torch.randn(2, history, config.num_time_features, generator=generator),
        "past_observed_mask": torch.ones(2, history, config.input_size),
        "future_values": torch.randn(2, config.prediction_length, config.input_size, generator=generator),
        "future_time_features": torch.randn(2, config.prediction_length, config.num_time_features, generator=generator),
    }


def first_output(output) -> torch.Tensor:
    """The main tensor of a model output (prediction, logits, or the first tensor field)."""
    params = getattr(output, "params", None)
    if params is not None:  # Autoformer / Informer: the distribution's parameters
        return torch.cat([p.flatten() for p in params])
    for key in ("prediction_outputs", "regression_outputs", "prediction_output", "prediction_logits", "logits"):
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value
    raise AssertionError(f"no known output tensor in {type(output).__name__}")


def train_a_few_steps(model, steps: int = 6, lr: float = 1e-2, **inputs) -> list[float]:
    """The losses of ``steps`` AdamW steps on ``model``'s trainable parameters over one batch ``inputs``: enough to
    see that training moves the loss."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def save_word_level_lm(folder: Path, vocab: int, hidden: int) -> Path:
    """A tiny tied Llama and a whitespace word-level tokenizer (``w1 … w{vocab-1}``) saved in ``folder``: a causal LM
    folder the LM recipes read like SmolLM2's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0} | {f"w{i}": i for i in range(1, vocab)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
