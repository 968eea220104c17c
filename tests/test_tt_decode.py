"""TT decode path (factored tied head), memory held after load, chunked TT-SVD and the automatic solver."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression, apply_tt
from hf_tensorcompress.methods.tt import logits as tt_logits
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.layer import TTEmbedding
from hf_tensorcompress.methods.tt.logits import best_cut, factored_logits
from hf_tensorcompress.methods.tt.solver import resolve_solver, tt_reconstruct, tt_svd

VOCAB, HIDDEN = 120, 24


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def spread_rows(count: int, size: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, size, generator=generator) * torch.linspace(3, 0.1, size)


@pytest.mark.parametrize("shape,ranks", [([4, 6], [3]), ([2, 3, 4], [2, 3]), ([2, 3, 2, 2], [2, 4, 2])])
@pytest.mark.parametrize("rows", [1, 5])
def test_factored_logits_equal_the_rebuilt_matrix_at_every_cut(shape, ranks, rows):
    torch.manual_seed(0)
    bounds = [1, *ranks, 1]
    cores = [torch.randn(50, bounds[k], shape[k], bounds[k + 1]) for k in range(len(shape))]
    hidden = torch.randn(rows, int(torch.tensor(shape).prod()))
    expected = hidden @ tt_reconstruct(cores).T
    for cut in range(1, len(shape)):
        torch.testing.assert_close(factored_logits(hidden, cores, cut=cut), expected, rtol=1e-4, atol=1e-4)
    ids = torch.tensor([3, 0, 49, 7])
    torch.testing.assert_close(factored_logits(hidden, cores, ids), expected[:, ids], rtol=1e-4, atol=1e-4)


def test_the_cost_model_factors_decoding_and_rebuilds_long_inputs():
    layer = TTEmbedding(49152, [8, 8, 9], [1, 1])
    assert best_cut([8, 8, 9], [1, 1], 1)[0] == 2  # left 8·8, right the largest mode
    assert layer._factored_is_cheaper(1) and layer._factored_is_cheaper(8)
    assert not layer._factored_is_cheaper(512)
    assert not TTEmbedding(100, [8, 8, 9], [5, 5])._factored_is_cheaper(8)


def compressed_llama(**options):
    model = tiny_llama()
    config = CompressionConfig(method="tt", tt_shape=[4, 6], tt_ranks=[2], **options)
    if options.get("tt_exact_tokens") or options.get("tt_basis") == "output":
        return apply_tt(model, config, torch.randint(3, VOCAB, (400,), generator=torch.Generator().manual_seed(2)))
    return apply_compression(model, config)


@pytest.mark.parametrize("options", [{}, {"tt_basis": "pca"}, {"tt_basis": "output", "tt_exact_tokens": 30}])
def test_every_head_path_gives_the_reference_logits_and_greedy_tokens(options, tmp_path):
    compressed_llama(**options).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    head = model.get_output_embeddings()
    assert type(head).__name__ == "TTTiedHead" and head.mode == "auto"
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    outputs = {}
    for mode in ("rebuild", "factored", "auto", "cached"):
        head.mode = mode
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        tokens = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=2)
        outputs[mode] = logits, tokens
    for mode in ("factored", "auto", "cached"):
        torch.testing.assert_close(outputs[mode][0], outputs["rebuild"][0], rtol=1e-4, atol=1e-4)
        assert torch.equal(outputs[mode][1], outputs["rebuild"][1]), mode


def test_no_dense_vocabulary_matrix_is_held_after_load_and_generate_unless_cached(tmp_path):
    compressed_llama(tt_basis="output", tt_exact_tokens=30).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False, pad_token_id=2)
    dense = VOCAB * HIDDEN
    held = {name: t.numel() for name, t in [*model.named_parameters(), *model.named_buffers()]}
    assert max(held.values()) < dense, held
    head = model.get_output_embeddings()
    assert head._cache is None
    head.mode = "cached"
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert head._cache is not None and head._cache[1].shape == (VOCAB, HIDDEN)  # what the cached mode costs


def test_the_cached_copy_follows_in_place_edits_of_the_cores():
    layer = TTEmbedding.from_weight(spread_rows(40, 24, seed=4), [4, 6], [2])
    head = TTTiedHead(layer)
    head.mode = "cached"
    hidden = torch.randn(3, 24)
    with torch.no_grad():
        head(hidden)
        layer.set_vectors([5], torch.randn(1, 24))
        torch.testing.assert_close(head(hidden), layer.logits(hidden, path="rebuild"))


def test_the_factored_path_keeps_its_layout_only_while_the_cores_and_exact_tokens_are_unchanged(monkeypatch):
    monkeypatch.setattr(tt_logits, "FACTORED_BLOCK", 7)  # several blocks over 40 tokens
    layer = TTEmbedding.from_weight(spread_rows(40, 24, seed=5), [4, 6], [2])
    layer.keep_exact(torch.tensor([0, 3, 9]), spread_rows(3, 24, seed=6))
    hidden = torch.randn(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(layer.logits(hidden, path="factored"), layer.logits(hidden, path="rebuild"))
        kept = layer._blocks_cache
        layer.logits(hidden, path="factored")
        assert layer._blocks_cache is kept  # reused between steps
        copied = pickle.loads(pickle.dumps(layer))  # the caches are not pickled, and rebuilt on use
        torch.testing.assert_close(copied.logits(hidden, path="factored"), layer.logits(hidden, path="rebuild"))
        layer.set_vectors([5], torch.randn(1, 24))  # the trains change
        torch.testing.assert_close(layer.logits(hidden, path="factored"), layer.logits(hidden, path="rebuild"))
        layer.keep_exact(torch.tensor([1, 5]), spread_rows(2, 24, seed=7))  # other exact tokens
        torch.testing.assert_close(layer.logits(hidden, path="factored"), layer.logits(hidden, path="rebuild"))
    layer.logits(hidden, path="factored").square().sum().backward()  # while training: built per call
    assert layer._blocks_cache is None and all(core.grad is not None for core in layer.cores)


def test_chunked_decomposition_equals_one_block_and_power_stays_close():
    weight = spread_rows(300, 72, seed=5)
    whole = tt_svd(weight, [4, 3, 6], [3, 2], solver="eigh", block=10_000)
    for block in (7, 64):
        cores, ranks = tt_svd(weight, [4, 3, 6], [3, 2], solver="eigh", block=block, progress=True)
        assert torch.equal(ranks, whole[1])
        torch.testing.assert_close(tt_reconstruct(cores), tt_reconstruct(whole[0]), atol=1e-5, rtol=1e-5)
    exact = (tt_reconstruct(whole[0]) - weight).norm()
    for block in (64, 10_000):  # power iteration starts from each block's summed Gram: close, not equal
        power = (tt_reconstruct(tt_svd(weight, [4, 3, 6], [3, 2], solver="power", block=block)[0]) - weight).norm()
        assert power <= 1.01 * exact
    eps_whole = tt_svd(weight, [4, 3, 6], eps=0.3, block=10_000)
    eps_chunked = tt_svd(weight, [4, 3, 6], eps=0.3, block=16)
    assert torch.equal(eps_whole[1], eps_chunked[1])
    torch.testing.assert_close(tt_reconstruct(eps_chunked[0]), tt_reconstruct(eps_whole[0]), atol=1e-5, rtol=1e-5)


def test_a_bfloat16_table_decomposes_block_by_block_into_its_own_dtype():
    weight = spread_rows(90, 24, seed=6).bfloat16()
    cores, _ = tt_svd(weight, [4, 6], [2], block=32)
    assert all(core.dtype == torch.bfloat16 for core in cores)
    reference, _ = tt_svd(weight.float(), [4, 6], [2], block=32)
    torch.testing.assert_close(tt_reconstruct(cores).float(), tt_reconstruct(reference), atol=0.05, rtol=0.05)


def test_the_auto_solver_picks_power_for_fixed_ranks_and_eigh_for_eps():
    assert resolve_solver("auto", [2, 2], None) == "power"
    assert resolve_solver("auto", None, 0.1) == "eigh"
    assert resolve_solver("auto", [2, 2], 0.1) == "eigh"
    assert resolve_solver("eigh", [2, 2], None) == "eigh"
    with pytest.raises(ValueError, match="not a TT-SVD solver"):
        resolve_solver("svd", [2], None)
    weight = spread_rows(200, 72, seed=7)
    auto, power = tt_svd(weight, [4, 3, 6], [3, 2]), tt_svd(weight, [4, 3, 6], [3, 2], solver="power")
    assert all(torch.equal(a, p) for a, p in zip(auto[0], power[0]))
    assert CompressionConfig(method="tt", tt_ranks=2, tt_solver="auto").tt_solver == "auto"


def test_the_layer_file_loads_and_decomposes_where_tqdm_is_missing(tmp_path):
    """The shipped copy of the layer (as a checkpoint holds it) needs tqdm only for its progress bar."""
    from hf_tensorcompress.core.export import write_modeling_code
    from hf_tensorcompress.core.registry import get_method

    package = tmp_path / "checkpoint_code"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_modeling_code(package, [get_method("tt")])
    script = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, *args):
                if name == "tqdm" or name.startswith("tqdm."):
                    raise ImportError("no tqdm here")
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(tmp_path)!r})
        from checkpoint_code import tt_solver as module
        import torch
        cores, _ = module.tt_svd(torch.randn(50, 12), [3, 4], [2], progress=True)
        assert "tqdm" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
