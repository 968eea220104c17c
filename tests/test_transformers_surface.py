"""The rest of the transformers surface on natively loaded compressed models: pipelines, generation with a KV cache
and left-padded batches, the Trainer, PEFT adapters (LoRA on every method is in test_peft.py)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers import LM_VOCAB, tiny_causal_lm, tiny_patchtst_config, train_a_few_steps
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    PatchTSTForPrediction,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    pipeline,
)

from hf_tensorcompress import CompressionConfig, apply_compression


def word_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(LM_VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="w0", bos_token="w0", eos_token="w1", pad_token="w2"
    )


@pytest.fixture(scope="module")
def tt_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tt-lm")
    model = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tt", tt_order=3, tt_ranks=3))
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def cp_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp")
    torch.manual_seed(0)
    model = PatchTSTForPrediction(tiny_patchtst_config())
    apply_compression(model, CompressionConfig(method="cp", cp_iterations=2))
    model.save_pretrained(folder)
    return folder


def test_text_generation_pipeline_on_a_tt_checkpoint(tt_folder):
    """``pipeline(model=dir)`` loads natively (transformers logs that it does not know the class name; it runs)."""
    generator = pipeline("text-generation", model=str(tt_folder))
    assert type(generator.model).__name__ == "CompressedLlamaForCausalLM"
    generated = generator("w5 w6 w7", max_new_tokens=4, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    ids = word_tokenizer()("w5 w6 w7", return_tensors="pt").input_ids
    expected = AutoModelForCausalLM.from_pretrained(tt_folder).generate(ids, max_new_tokens=4, do_sample=False)
    assert list(generated) == expected[0].tolist()


def test_generate_with_kv_cache_and_left_padded_batches(tt_folder):
    model = AutoModelForCausalLM.from_pretrained(tt_folder)
    tokenizer = word_tokenizer()
    tokenizer.padding_side = "left"
    prompts = ["w5 w6 w7 w8 w9", "w9 w10", "w30 w31 w32"]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    batched = model.generate(**batch, max_new_tokens=6, do_sample=False, use_cache=True)[:, -6:]
    for row, prompt in zip(batched, prompts):
        single = tokenizer(prompt, return_tensors="pt")
        cached = model.generate(**single, max_new_tokens=6, do_sample=False, use_cache=True)
        uncached = model.generate(**single, max_new_tokens=6, do_sample=False, use_cache=False)
        assert torch.equal(cached, uncached)
        assert row.tolist() == cached[0, -6:].tolist()


def forecasting_data() -> Dataset:
    generator = torch.Generator().manual_seed(0)
    return Dataset.from_dict(
        {
            "past_values": torch.randn(32, 32, 3, generator=generator).tolist(),
            "future_values": torch.randn(32, 8, 3, generator=generator).tolist(),
        }
    )


def test_trainer_fine_tunes_a_natively_loaded_compressed_model(cp_folder, tmp_path):
    model = PatchTSTForPrediction.from_pretrained(cp_folder)
    layer = model.model.encoder.layers[0].self_attn.q_proj
    before = [factor.detach().clone() for factor in layer.factors]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=8,
        report_to=[],
        learning_rate=1e-2,
        save_strategy="no",
        use_cpu=True,
    )
    Trainer(model=model, args=args, train_dataset=forecasting_data()).train()
    assert all(not torch.equal(old, new) for old, new in zip(before, layer.factors))
    model.save_pretrained(tmp_path / "tuned")
    again = PatchTSTForPrediction.from_pretrained(tmp_path / "tuned")
    assert torch.equal(again.model.encoder.layers[0].self_attn.q_proj.factor_out, layer.factor_out)


def test_lora_on_a_cp_model_trains_saves_and_loads(cp_folder, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    peft_model = get_peft_model(
        PatchTSTForPrediction.from_pretrained(cp_folder), LoraConfig(r=2, target_modules=["out_proj"], lora_dropout=0.0)
    )
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    batch = forecasting_data()[:8]
    past, future = torch.tensor(batch["past_values"]), torch.tensor(batch["future_values"])
    losses = train_a_few_steps(peft_model, past_values=past, future_values=future)
    assert losses[-1] < losses[0]
    peft_model.eval()
    tuned = peft_model(past_values=past).prediction_outputs
    peft_model.save_pretrained(tmp_path / "adapter")
    base = PatchTSTForPrediction.from_pretrained(cp_folder)
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    torch.testing.assert_close(reloaded(past_values=past).prediction_outputs, tuned)
