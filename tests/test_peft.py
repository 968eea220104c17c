"""PEFT LoRA on top of every method: adapters on the uncompressed Linear layers train, save, load to the same
outputs and merge; an adapter aimed at a compressed layer is refused by PEFT with a message naming the layer."""

from __future__ import annotations

import pytest
import torch
from family_models import tiny
from helpers import train_a_few_steps
from peft import LoraConfig, PeftModel, get_peft_model

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.loading import load_model

IDS = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(0))
CONFIGS = {
    "cp": CompressionConfig(method="cp", rank=0.5, cp_iterations=5),
    "svd": CompressionConfig(method="svd", rank=0.5),
    "biprop": CompressionConfig(method="biprop", keep_ratio=0.5),
    "tt": CompressionConfig(method="tt", tt_shape=[4, 8], tt_ranks=2),
}
#: Uncompressed Linear layers of a Llama block under every method (biprop also takes o_proj).
LORA_TARGETS = ["gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_lora_trains_saves_loads_and_merges_on_a_compressed_model(method, tmp_path):
    model = apply_compression(tiny("llama"), CONFIGS[method])
    model.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=LORA_TARGETS, lora_dropout=0.0))
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    losses = train_a_few_steps(peft_model, input_ids=IDS, labels=IDS)
    assert losses[-1] < losses[0]
    peft_model.eval()
    with torch.no_grad():
        tuned = peft_model(input_ids=IDS).logits
    peft_model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(load_model(tmp_path / "base"), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=IDS).logits, tuned)
        merged = reloaded.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=IDS).logits, tuned, atol=1e-5, rtol=1e-5)
    assert type(merged).__name__.startswith("Compressed")  # still the compressed model, adapters folded in


def test_an_adapter_on_a_compressed_layer_is_refused_by_name():
    model = apply_compression(tiny("llama"), CONFIGS["cp"])
    with pytest.raises(ValueError, match="Target module CPLinear.*is not supported"):
        get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
