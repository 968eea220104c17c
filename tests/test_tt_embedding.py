"""TT token embeddings (method="tt"): decomposition, lookup, tied head, adaptive vocabulary, export, PEFT."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import numpy as np
import pytest
import tensorly as tl
import torch
from tensorly.decomposition import tensor_train
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.methods.tt import solver as tt_solver
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.layer import TTEmbedding
from hf_tensorcompress.methods.tt.solver import balanced_shape, tt_reconstruct, tt_svd

VOCAB, HIDDEN = 120, 24


def tiny(kind: str, tie: bool = True):
    torch.manual_seed(0)
    if kind == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=VOCAB,
                n_embd=HIDDEN,
                n_layer=2,
                n_head=2,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=1,
                tie_word_embeddings=tie,
            )
        )
    elif kind == "opt":
        model = OPTForCausalLM(
            OPTConfig(
                vocab_size=VOCAB,
                hidden_size=HIDDEN,
                num_hidden_layers=2,
                ffn_dim=32,
                num_attention_heads=2,
                max_position_embeddings=64,
                word_embed_proj_dim=HIDDEN,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=2,
                tie_word_embeddings=tie,
            )
        )
    else:
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=HIDDEN,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                bos_token_id=0,
                eos_token_id=1,
                tie_word_embeddings=tie,
            )
        )
    return model.eval()


IDS = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------------------------------------- decomposition
def test_balanced_shape_picks_the_closest_factors_and_rejects_impossible_orders():
    assert balanced_shape(576, 3) == [8, 8, 9]
    assert balanced_shape(768, 2) == [24, 32]
    assert balanced_shape(64, 6) == [2] * 6
    with pytest.raises(ValueError, match="cannot be split"):
        balanced_shape(14, 3)


def test_full_ranks_reconstruct_exactly_and_lookup_matches_rows():
    weight = torch.randn(50, 24)
    layer = TTEmbedding.from_weight(weight, [2, 3, 4], max_ranks=[100, 100])
    assert layer.ranks == [2, 4]  # capped by the unfoldings' sizes
    torch.testing.assert_close(layer.weight, weight, atol=1e-5, rtol=1e-5)
    ids = torch.tensor([[3, 7, 7], [0, 49, 1]])
    torch.testing.assert_close(layer(ids), weight[ids], atol=1e-5, rtol=1e-5)


def test_truncated_ranks_match_tensorly_tt_svd_per_token():
    torch.manual_seed(0)
    weight = torch.randn(40, 72) * torch.linspace(3, 0.1, 72)
    layer = TTEmbedding.from_weight(weight, [4, 3, 6], max_ranks=[3, 2], solver="eigh")  # the exact algorithm
    ours = (layer.weight - weight).norm(dim=1)
    theirs = []
    for vector in weight.double().numpy():
        cores = tensor_train(vector.reshape(4, 3, 6), [1, 3, 2, 1])
        theirs.append(np.linalg.norm(tl.tt_to_tensor(cores).reshape(-1) - vector))
    np.testing.assert_allclose(ours.detach().double().numpy(), np.array(theirs), rtol=1e-3, atol=1e-5)
    assert layer.stored_parameters() == 40 * (4 * 3 + 3 * 3 * 2 + 2 * 6)


def test_eps_mode_bounds_every_token_error_and_pads_ragged_ranks_with_zeros():
    torch.manual_seed(0)
    weight = torch.randn(64, 72) * torch.linspace(3, 0.05, 72) ** torch.rand(64, 1).mul(3)
    eps = 0.3
    layer = TTEmbedding.from_weight(weight, [4, 3, 6], eps=eps)
    relative = (layer.weight - weight).norm(dim=1) / weight.norm(dim=1)
    assert bool((relative <= eps + 1e-5).all())
    ranks = layer.token_ranks
    assert len({tuple(r) for r in ranks.tolist()}) > 1, "tokens should get different ranks"
    assert layer.ranks == ranks.max(dim=0).values.tolist()
    low = int((ranks[:, 0] < layer.ranks[0]).nonzero()[0])
    assert bool((layer.cores[0][low, :, :, ranks[low, 0] :] == 0).all())
    assert layer.effective_parameters() < layer.stored_parameters()
    per_token = torch.full((64,), 0.05)
    tighter = TTEmbedding.from_weight(weight, [4, 3, 6], eps=per_token)
    assert tighter.effective_parameters() > layer.effective_parameters()


def _spread_rows(count: int, size: int, seed: int) -> torch.Tensor:
    """Rows with a decaying spectrum, like an embedding's: a few strong directions, a long weak tail."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, size, generator=generator) * torch.linspace(2, 0.2, size)


@contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count set for the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_blocks_over_threads_give_what_one_batch_gives(monkeypatch):
    """Large vocabularies go through fixed blocks on a thread pool; the exact solver's result must not depend on
    either (power iteration starts from each block's summed Gram, so its blocks matter a little: see
    tests/test_tt_decode.py)."""
    weight = _spread_rows(700, 72, seed=0)
    eps = torch.linspace(0.2, 0.6, 700)  # per-token budgets, so blocks store different ranks
    whole = {
        mode: tt_svd(weight, [4, 3, 6], **kwargs)
        for mode, kwargs in {"fixed": {"max_ranks": [3, 2], "solver": "eigh"}, "eps": {"eps": eps}}.items()
    }
    monkeypatch.setattr(tt_solver, "DECOMPOSE_BLOCK", 128)
    for count in (1, 3):
        with torch_threads(count):
            for mode, kwargs in {"fixed": {"max_ranks": [3, 2], "solver": "eigh"}, "eps": {"eps": eps}}.items():
                cores, ranks = tt_svd(weight, [4, 3, 6], **kwargs)
                assert torch.equal(ranks, whole[mode][1])
                assert [c.shape for c in cores] == [c.shape for c in whole[mode][0]]
                torch.testing.assert_close(tt_reconstruct(cores), tt_reconstruct(whole[mode][0]), atol=1e-5, rtol=1e-5)


def test_power_solver_stays_within_one_percent_of_exact_tt_svd_and_is_thread_independent(monkeypatch):
    weight = _spread_rows(1500, 72, seed=1)
    weight[7] = 0  # no dominant subspace at all
    weight[8] = torch.einsum("i,j,k->ijk", torch.randn(4), torch.randn(3), torch.randn(6)).reshape(-1)  # ranks 1, 1
    monkeypatch.setattr(tt_solver, "DECOMPOSE_BLOCK", 512)
    exact, _ = tt_svd(weight, [4, 3, 6], [3, 2])
    power, ranks = tt_svd(weight, [4, 3, 6], [3, 2], solver="power")
    assert bool((ranks == torch.tensor([3, 2], dtype=torch.int32)).all())

    def error(cores):
        return float((tt_reconstruct(cores) - weight).norm() / weight.norm())

    assert error(exact) <= error(power) <= 1.01 * error(exact)
    rebuilt = tt_reconstruct(power)
    assert bool(torch.isfinite(rebuilt).all())
    assert float(rebuilt[7].abs().max()) == 0.0
    torch.testing.assert_close(rebuilt[8], weight[8], atol=1e-5, rtol=1e-4)  # rank-1 Grams: eigh, exact
    with torch_threads(1):
        torch.testing.assert_close(tt_reconstruct(tt_svd(weight, [4, 3, 6], [3, 2], solver="power")[0]), rebuilt)


def test_power_solver_refuses_the_eps_mode():
    with pytest.raises(ValueError, match="fixed dimension"):
        tt_svd(torch.randn(4, 24), [2, 3, 4], eps=0.3, solver="power")
    with pytest.raises(ValueError, match="choose one of"):
        tt_svd(torch.randn(4, 24), [2, 3, 4], [2, 2], solver="svd")


def test_cores_are_trainable_parameters():
    layer = TTEmbedding.from_weight(torch.randn(10, 24), [2, 3, 4], max_ranks=[2, 2])
    layer(torch.tensor([1, 2, 2])).sum().backward()
    grads = [core.grad for core in layer.cores]
    assert all(g is not None for g in grads)
    assert grads[0][1].abs().sum() > 0 and grads[0][5].abs().sum() == 0


def test_add_then_remove_tokens_restores_every_core_exactly():
    layer = TTEmbedding.from_weight(torch.randn(30, 24), [2, 3, 4], max_ranks=[2, 3])
    before = [core.detach().clone() for core in layer.cores]
    ids, mapping = layer.add_tokens(torch.randn(5, 24))
    assert ids.tolist() == list(range(30, 35)) and len(mapping) == 3 and layer.num_embeddings == 35
    layer.remove_tokens(ids)
    for core, old in zip(layer.cores, before):
        assert torch.equal(core, old)
    with pytest.raises(IndexError, match="token ids"):
        layer.remove_tokens([99])


def test_a_new_token_is_compressed_like_the_vocabulary():
    exact = TTEmbedding.from_weight(torch.randn(8, 24), [2, 3, 4], max_ranks=[2, 4])
    vector = torch.randn(1, 24)
    (new,), _ = exact.add_tokens(vector)
    torch.testing.assert_close(exact(new.view(1)), vector, atol=1e-5, rtol=1e-5)
    truncated = TTEmbedding.from_weight(torch.randn(8, 24), [2, 3, 4], max_ranks=[1, 1])
    (new,), _ = truncated.add_tokens(vector)
    cores, ranks = tt_svd(vector, [2, 3, 4], [1, 1])
    assert ranks.tolist() == [[1, 1]] and truncated.token_ranks[-1].tolist() == [1, 1]
    torch.testing.assert_close(truncated(new.view(1)), TTEmbedding.from_weight(vector, [2, 3, 4], [1, 1]).weight)


# ---------------------------------------------------------------------------------------------- config / method
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "needs tt_ranks"),
        ({"tt_ranks": 0}, "tt_ranks"),
        ({"tt_ranks": [2, 2], "tt_shape": [4, 6]}, "needs 1"),
        ({"tt_eps": 1.5}, "tt_eps"),
        ({"tt_ranks": 2, "tt_order": 1}, "tt_order"),
        ({"tt_ranks": 2, "tt_shape": [2, 3, 4], "tt_order": 2}, "contradicts"),
        ({"tt_ranks": 2, "tt_solver": "svd"}, "tt_solver"),
        ({"tt_ranks": 2, "tt_eps": 0.3, "tt_solver": "power"}, "no tt_eps"),
    ],
)
def test_config_errors_say_what_would_be_right(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="tt", **kwargs)


def test_wrong_shape_leaves_the_model_untouched():
    model = tiny("gpt2")
    with pytest.raises(ValueError, match=r"multiplies to 30.*tt_shape=\[4, 6\]"):
        apply_compression(model, CompressionConfig(method="tt", tt_shape=[5, 6], tt_ranks=2))
    assert type(model.transformer.wte) is torch.nn.Embedding


@pytest.mark.parametrize("kind", ["gpt2", "opt", "llama"])
def test_compressed_causal_lms_keep_full_vocabulary_logits_and_generate(kind):
    model = tiny(kind)
    reference = model(IDS).logits
    apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=100))
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, TTEmbedding) and isinstance(model.get_output_embeddings(), TTTiedHead)
    assert sum(p.numel() for p in model.get_output_embeddings().parameters()) == 0
    torch.testing.assert_close(model(IDS).logits, reference, atol=1e-4, rtol=1e-4)
    apply_truncated = tiny(kind)
    apply_compression(apply_truncated, CompressionConfig(method="tt", tt_order=3, tt_ranks=1))
    logits = apply_truncated(IDS).logits
    assert logits.shape == reference.shape and not torch.allclose(logits, reference, atol=1e-3)
    out = apply_truncated.generate(IDS[:1], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 4)


def test_untied_variant_keeps_a_dense_output_layer():
    model = tiny("llama")
    head = model.lm_head.weight.detach().clone()
    apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_untie_output=True))
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, head)
    assert model.config.tie_word_embeddings is False


def test_untied_base_model_compresses_only_the_input_embedding():
    model = tiny("llama", tie=False)
    apply_compression(model, CompressionConfig(method="tt", tt_shape=[4, 6], tt_ranks=4))
    assert type(model.lm_head) is torch.nn.Linear
    assert list(model.config.compression_config["modules"]) == ["model.embed_tokens"]


# ---------------------------------------------------------------------------------------------- vocabulary
def test_adding_100_tokens_and_removing_them_gives_back_the_same_outputs():
    model = tiny("gpt2")
    apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    before = model(IDS).logits
    embedding = model.get_input_embeddings()
    ids, _ = embedding.add_tokens(torch.randn(100, HIDDEN))
    grown = model(IDS).logits
    assert grown.shape[-1] == VOCAB + 100
    torch.testing.assert_close(grown[..., :VOCAB], before)
    embedding.remove_tokens(ids)
    assert torch.equal(model(IDS).logits, before)


def test_resize_token_embeddings_with_a_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(VOCAB)}
    backend = Tokenizer(models.WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")
    model = tiny("llama")
    apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    before = model(IDS).logits
    tokenizer.add_tokens(["<city>", "<name>"])
    model.resize_token_embeddings(len(tokenizer))
    assert model.config.vocab_size == VOCAB + 2
    assert model.config.compression_config["modules"]["model.embed_tokens"]["num_embeddings"] == VOCAB + 2
    new = tokenizer("w5 <city>", return_tensors="pt").input_ids
    assert new[0, -1].item() == VOCAB
    assert model(new).logits.shape[-1] == VOCAB + 2
    torch.testing.assert_close(model(IDS).logits[..., :VOCAB], before)
    model.resize_token_embeddings(VOCAB)
    assert torch.equal(model(IDS).logits, before)


# ---------------------------------------------------------------------------------------------- export
BLOCKER = textwrap.dedent(
    """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == "hf_tensorcompress" or name.startswith("hf_tensorcompress."):
                raise ImportError("hf_tensorcompress is blocked in this process")
    sys.meta_path.insert(0, _Block())
    """
)


def run_without_library(code: str) -> dict:
    """Run ``code`` where hf_tensorcompress cannot be imported; it prints one JSON line."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(  # llama in the fast tier, GPT-2 and OPT in the slow tier
    "kind", ["llama", pytest.param("gpt2", marks=pytest.mark.slow), pytest.param("opt", marks=pytest.mark.slow)]
)
def test_save_and_load_without_the_library_reproduces_logits_and_generation_also_after_adding_tokens(kind, tmp_path):
    model = tiny(kind)
    apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=2, tt_eps=0.4))
    model.resize_token_embeddings(VOCAB + 3)
    model.get_input_embeddings().set_vectors([VOCAB, VOCAB + 1, VOCAB + 2], torch.randn(3, HIDDEN))
    ids = torch.cat([IDS, torch.tensor([[VOCAB, VOCAB + 2]] * 2)], dim=1)
    logits = model(ids).logits
    generated = model.generate(ids[:1], max_new_tokens=6, do_sample=False)
    model.save_pretrained(tmp_path)
    torch.save(ids, tmp_path / "ids.pt")
    loaded = run_without_library(
        f"""
        import json, torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        with torch.no_grad():
            logits = model(ids).logits
        generated = model.generate(ids[:1], max_new_tokens=6, do_sample=False)
        print(json.dumps({{"logits": logits.tolist(), "generated": generated.tolist(),
                          "head": type(model.get_output_embeddings()).__name__}}))
        """
    )
    assert loaded["head"] == "TTTiedHead"
    assert torch.equal(torch.tensor(loaded["logits"]), logits.detach())
    assert loaded["generated"] == generated.tolist()
    same = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert torch.equal(same(ids).logits, logits)


# ---------------------------------------------------------------------------------------------- output-aware basis
def test_a_basis_is_exact_at_full_rank_and_new_tokens_go_through_it():
    torch.manual_seed(0)
    weight = torch.randn(30, 24)
    basis = torch.randn(24, 24) + 4 * torch.eye(24)
    layer = TTEmbedding.from_weight(weight, [2, 3, 4], max_ranks=[100, 100], basis=basis)
    torch.testing.assert_close(layer.weight, weight, atol=1e-4, rtol=1e-4)
    vector = torch.randn(2, 24)
    ids, _ = layer.add_tokens(vector)
    torch.testing.assert_close(layer(ids), vector, atol=1e-4, rtol=1e-4)
    assert layer.stored_parameters() == 32 * (2 * 2 + 2 * 3 * 4 + 4 * 4) + 24 * 24


def test_output_basis_needs_calibration_and_lowers_the_logit_error(tmp_path):
    from hf_tensorcompress import apply_tt
    from hf_tensorcompress.methods.tt.calibration import hidden_covariance

    with pytest.raises(ValueError, match="calibration"):
        apply_tt(tiny("gpt2"), CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_basis="output"))
    calibration = torch.randint(3, VOCAB, (256,), generator=torch.Generator().manual_seed(2))
    dense = tiny("gpt2")
    hidden = dense(IDS, output_hidden_states=True).hidden_states[-1].detach()
    reference = dense(IDS).logits
    errors = {}
    for basis in ("identity", "output"):
        model = apply_tt(
            tiny("gpt2"), CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_basis=basis), calibration
        )
        errors[basis] = (model.lm_head(hidden) - reference).pow(2).mean().item()
    assert errors["output"] < errors["identity"]
    assert hidden_covariance(dense, calibration).shape == (HIDDEN, HIDDEN)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert loaded.config.compression_config["tt_basis"] == "output"
    assert torch.equal(loaded(IDS).logits, model(IDS).logits)


def test_exact_tokens_are_served_dense_in_lookup_logits_and_vocabulary_edits(tmp_path):
    from hf_tensorcompress import apply_tt

    calibration = torch.tensor([5] * 9 + [7] * 5 + [9] * 3 + [11])
    config = CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_basis="output", tt_exact_tokens=3)
    dense = tiny("gpt2")
    weight = dense.transformer.wte.weight.detach().clone()
    hidden = dense(IDS, output_hidden_states=True).hidden_states[-1].detach()
    with pytest.raises(ValueError, match="calibration"):
        apply_tt(tiny("gpt2"), config)
    model = apply_tt(tiny("gpt2"), config, calibration)
    layer = model.get_input_embeddings()
    exact = torch.tensor([5, 7, 9])
    assert torch.equal(layer(exact), weight[exact]) and not torch.allclose(layer(torch.tensor([11])), weight[11:12])
    logits = model.lm_head(hidden)
    torch.testing.assert_close(logits[..., exact], hidden @ weight[exact].T)
    assert (
        layer.stored_parameters()
        == layer.cores[0].numel() + layer.cores[1].numel() + layer.cores[2].numel() + HIDDEN * HIDDEN + 3 * HIDDEN
    )
    before = model(IDS).logits
    ids, _ = layer.add_tokens(torch.randn(100, HIDDEN))
    layer.remove_tokens(ids)
    assert torch.equal(model(IDS).logits, before)
    ids, _ = layer.add_tokens(torch.randn(100, HIDDEN))
    layer.remove_tokens(torch.cat([torch.tensor([0]), ids]))  # removing token 0 shifts the exact tokens down
    assert torch.equal(layer(exact - 1), weight[exact])
    model.resize_token_embeddings(VOCAB - 1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert loaded.config.compression_config["modules"]["transformer.wte"]["exact_tokens"] == 3
    assert torch.equal(loaded(IDS - 1).logits, model(IDS - 1).logits)


def test_exact_tokens_beyond_the_calibration_text_follow_token_id_order():
    from hf_tensorcompress.methods.tt.calibration import exact_token_ids

    counts = torch.zeros(10, dtype=torch.long)
    counts[[7, 3]] = torch.tensor([5, 2])
    assert exact_token_ids(counts, 5).tolist() == [7, 3, 0, 1, 2]
    assert len(exact_token_ids(counts, 50)) == 10


# ---------------------------------------------------------------------------------------------- healing
@pytest.mark.parametrize("kind", ["llama", "gpt2", "opt"])
def test_the_hidden_states_healing_reads_are_what_the_output_layer_reads(kind):
    """The decoder alone gives the states the head multiplies: through the head, the full model's logits, window by
    window."""
    from hf_tensorcompress.methods.tt.healing import final_hidden_states

    model = tiny(kind).eval()
    ids = IDS.reshape(-1)
    hidden = final_hidden_states(model, ids, window=10)
    with torch.no_grad():
        expected = torch.cat([model(input_ids=ids[a : a + 10][None]).logits[0] for a in range(0, len(ids), 10)])
        torch.testing.assert_close(model.get_output_embeddings()(hidden), expected)


def test_healing_lowers_the_output_kl_and_trains_only_the_cores(tmp_path):
    import torch.nn.functional as F

    from hf_tensorcompress import apply_tt
    from hf_tensorcompress.methods.tt.healing import final_hidden_states, heal_tt_embedding

    def peaked_llama():  # larger embeddings: logits far from uniform, so there is something to distil
        model = tiny("llama")
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(20)
        return model

    teacher = peaked_llama()
    calibration = torch.randint(3, VOCAB, (512,), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="method='tt'"):
        heal_tt_embedding(tiny("llama"), teacher, calibration)
    untied = apply_compression(
        tiny("llama"), CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_untie_output=True)
    )
    with pytest.raises(ValueError, match="TTTiedHead"):
        heal_tt_embedding(untied, teacher, calibration)
    student = apply_tt(
        peaked_llama(),
        CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_basis="output", tt_exact_tokens=8),
        calibration,
    )
    hidden = final_hidden_states(teacher, IDS.reshape(-1), window=12)
    target = F.log_softmax(teacher.lm_head(hidden), dim=-1).detach()

    def held_out_kl() -> float:
        with torch.no_grad():
            logits = student.get_input_embeddings().logits(hidden)
            return float(F.kl_div(F.log_softmax(logits, -1), target, log_target=True, reduction="batchmean"))

    frozen = {name: p.detach().clone() for name, p in student.named_parameters() if ".cores." not in name}
    before = held_out_kl()
    losses = heal_tt_embedding(
        student, teacher, calibration, steps=60, tokens_per_step=128, learning_rate=1e-2, progress=False
    )
    assert held_out_kl() < 0.8 * before
    assert sum(losses[-10:]) < sum(losses[:10])
    assert all(torch.equal(p, frozen[name]) for name, p in student.named_parameters() if name in frozen)
    student.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert torch.equal(loaded(IDS).logits, student(IDS).logits)
