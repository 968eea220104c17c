"""A chat model compressed by ``size_ratio`` with prose calibration alone still chats: SmolLM2-135M-Instruct at 6×,
weighed by 8k tokens of Moby Dick and nothing else (``model_text_tokens=0``, the setting that answered
``'<<<<<"<<<'`` before its special tokens were protected and the held-back check existed). Its chat-template tokens
come from ``template_tokens``, as the command line passes them."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tensorcompress import CompressionConfig, apply_tiered, assets
from hf_tensorcompress.data.causal_lm import smollm2_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.methods.tiered.guard import template_tokens

pytestmark = pytest.mark.slow  # a 6× build of a 135M-parameter model

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Can you suggest a quick dinner for two?"},
    {"role": "assistant", "content": "Try a vegetable stir-fry with rice: it takes about twenty minutes."},
    {"role": "user", "content": "What should I buy for it?"},
    {"role": "assistant", "content": "Rice, two peppers, an onion, garlic, soy sauce and some tofu or chicken."},
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat_loss(model, tokenizer) -> float:
    ids = tokenizer.apply_chat_template(CONVERSATION, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def answer(model, tokenizer) -> str:
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def test_a_chat_model_weighed_by_prose_alone_still_chats():
    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    protected = template_tokens(tokenizer)
    for part in ("<|im_start|>", "<|im_end|>", "system", "user", "assistant"):
        assert set(tokenizer.encode(part, add_special_tokens=False)) <= set(protected), part
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    dense_loss, dense_answer = chat_loss(model, tokenizer), answer(model, tokenizer)
    prose = token_ids(tokenizer, split_documents(text_dataset(assets.moby_dick_dir()), 0.25)[0], 8192)
    config = CompressionConfig(
        method="tiered", size_ratio=6, rounding="output", model_text_tokens=0, protected_tokens=protected
    )
    apply_tiered(model, config, prose)
    assert chat_loss(model, tokenizer) - dense_loss <= 0.3
    assert "Paris" in dense_answer and "Paris" in answer(model, tokenizer)
