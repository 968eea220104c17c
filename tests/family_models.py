"""Tiny randomly initialised models of every family in the family table beyond the time-series ones."""

from __future__ import annotations

import torch
import transformers as T

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)

#: Llama 3's rotary scaling (the tiny "llama" is a Llama 3 config with an untied head, as Llama 3 8B has).
LLAMA3 = dict(
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
)

#: family -> (model class, config). Gemma/Gemma 2/Gemma 3 scale their embedding (Gemma 3's
#: ``Gemma3TextScaledWordEmbedding``, with a ``padding_idx`` as Phi-3's has); GPT-2 fuses q/k/v in a ``Conv1D``,
#: Phi-3 and GPT-NeoX in a ``Linear``; BERT ties a masked-LM decoder (with a bias) to the embedding.
LANGUAGE_MODELS = {
    "gpt2": (
        T.GPT2LMHeadModel,
        lambda: T.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        ),
    ),
    "opt": (
        T.OPTForCausalLM,
        lambda: T.OPTConfig(
            vocab_size=96,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            pad_token_id=1,
        ),
    ),
    "llama": (T.LlamaForCausalLM, lambda: T.LlamaConfig(**SMALL, num_key_value_heads=2, eos_token_id=2, **LLAMA3)),
    "qwen2": (T.Qwen2ForCausalLM, lambda: T.Qwen2Config(**SMALL, num_key_value_heads=2)),
    "qwen3": (T.Qwen3ForCausalLM, lambda: T.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8)),
    "mistral": (T.MistralForCausalLM, lambda: T.MistralConfig(**SMALL, num_key_value_heads=2, eos_token_id=2)),
    "phi": (T.PhiForCausalLM, lambda: T.PhiConfig(**SMALL)),
    "phi3": (T.Phi3ForCausalLM, lambda: T.Phi3Config(**SMALL, pad_token_id=0, eos_token_id=2, bos_token_id=1)),
    "gpt_neox": (T.GPTNeoXForCausalLM, lambda: T.GPTNeoXConfig(**SMALL)),
    "gemma": (T.GemmaForCausalLM, lambda: T.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=8)),
    "gemma2": (T.Gemma2ForCausalLM, lambda: T.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8)),
    "gemma3_text": (
        T.Gemma3ForCausalLM,
        lambda: T.Gemma3TextConfig(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=16, pad_token_id=0),
    ),
    "bert": (T.BertForMaskedLM, lambda: T.BertConfig(**SMALL)),
}

#: Encoders with attention but no token-embedding lookup method (cp/svd/biprop only).
ENCODERS = {
    "vit": (
        T.ViTModel,
        lambda: T.ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
    ),
    "whisper": (
        T.WhisperModel,
        lambda: T.WhisperConfig(
            vocab_size=96,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_mel_bins=8,
            max_source_positions=16,
            max_target_positions=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        ),
    ),
}

FAMILIES = {**LANGUAGE_MODELS, **ENCODERS}


def tiny(family: str) -> torch.nn.Module:
    model_class, config = FAMILIES[family]
    torch.manual_seed(0)
    return model_class(config()).eval()


def tiny_inputs(family: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=generator)}
    if family == "whisper":
        return {
            "input_features": torch.randn(2, 8, 32, generator=generator),
            "decoder_input_ids": torch.randint(3, 96, (2, 5), generator=generator),
        }
    return {"input_ids": torch.randint(3, 96, (2, 7), generator=generator)}


def first_output(output) -> torch.Tensor:
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state
