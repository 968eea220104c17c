import tensorly as tl
import torch
from tensorly.decomposition import parafac
from torch import nn

from hf_tensorcompress import CPLinear, LowRankLinear, replace_parameters_in_optimizer
from hf_tensorcompress.methods.cp.apply import decompose
from hf_tensorcompress.methods.cp.layer import cp_als, cp_reconstruct


def _layer(rank=6, seed=0) -> CPLinear:
    torch.manual_seed(seed)
    linear = nn.Linear(32, 24)
    layer = CPLinear(32, 24, num_heads=4, rank=rank)
    layer.load_factors(decompose(layer.folded_weight(linear.weight.detach()), rank, 50))
    layer.bias.data.copy_(linear.bias.data)
    return layer


def test_parameters_match_paper_table_1():
    layer = CPLinear(64, 64, num_heads=8, rank=5, bias=False)
    assert sum(p.numel() for p in layer.parameters()) == 5 * (64 + 8 + 8)


def test_both_forward_paths_give_the_same_result():
    layer = _layer(rank=6)
    x = torch.randn(3, 7, 32)
    expected = x @ layer.weight.T + layer.bias
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    # rank 20 costs 20·(32+24) per token factorized vs 32·24 dense: few tokens -> factorized, many -> reconstruct
    big = _layer(rank=20)
    assert big.multiply_adds(21)[1] == "factorized" and big.multiply_adds(100_000)[1] == "reconstruct"
    with torch.no_grad():
        torch.testing.assert_close(big(x), x @ big.weight.T + big.bias, atol=1e-5, rtol=1e-5)
    x_many = torch.randn(100_000, 32)
    torch.testing.assert_close(big(x_many), x_many @ big.weight.T + big.bias, atol=1e-4, rtol=1e-4)


def test_inference_cache_follows_parameter_updates():
    layer = _layer(rank=20)
    x = torch.randn(100_000, 32)
    with torch.no_grad():
        first = layer(x)
        layer.factor_out.mul_(2.0)
        second = layer(x)
    torch.testing.assert_close(second - layer.bias, 2 * (first - layer.bias), atol=1e-4, rtol=1e-4)


def test_torch_als_is_as_accurate_as_tensorly():
    torch.manual_seed(0)
    tensor = torch.randn(8, 16, 64, dtype=torch.float64)
    with tl.backend_context("pytorch"):
        cold = parafac(tensor, rank=20, init="svd", n_iter_max=200, tol=1e-12)
        tensorly_error = float((tl.cp_to_tensor(cold) - tensor).norm() / tensor.norm())
    _, ours = cp_als(tensor, [torch.randn(s, 20, dtype=torch.float64) for s in tensor.shape], n_iter=200)
    assert ours <= tensorly_error * 1.05


def test_set_rank_shrinks_and_grows_with_a_warm_start():
    layer = _layer(rank=12)
    dense = layer.weight.detach().clone()
    mapping = layer.set_rank(6)
    assert layer.rank == 6 and all(old.shape[1] == 12 and new.shape[1] == 6 for old, new in mapping.items())
    shrunk = layer.weight.detach().clone()
    shrunk_error = float((shrunk - dense).norm() / dense.norm())
    assert shrunk_error < 1.0
    layer.set_rank(12)  # growing keeps the function exactly; the new components are for training to fill
    assert layer.rank == 12
    torch.testing.assert_close(layer.weight, shrunk, atol=1e-6, rtol=1e-6)
    layer.weight.sum().backward()
    assert float(layer.factor_out.grad[:, 6:].abs().sum()) > 0  # the new components train from the first step
    # a dozen warm sweeps get close to a converged cold decomposition at the same rank
    target = layer.folded_weight(dense).double()
    cold_error = float((cp_reconstruct(decompose(target, 6, 200)) - target).norm() / target.norm())
    assert shrunk_error <= 1.15 * cold_error


def test_optimizer_trains_the_new_factors_after_a_rank_change():
    layer = _layer(rank=8)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = torch.randn(64, 32), torch.randn(64, 24)
    nn.functional.mse_loss(layer(x), y).backward()
    optimizer.step()
    scheduler.step()
    swapped = replace_parameters_in_optimizer(optimizer, layer.set_rank(4))
    assert swapped == 3
    before = [f.detach().clone() for f in layer.factors]
    optimizer.zero_grad()
    nn.functional.mse_loss(layer(x), y).backward()
    optimizer.step()
    scheduler.step()
    assert all(not torch.equal(b, f) for b, f in zip(before, layer.factors))
    assert optimizer.param_groups[0]["lr"] == 1e-2 * 0.25  # the scheduler still drives the same optimizer


def test_lowrank_set_rank_is_the_best_approximation():
    torch.manual_seed(0)
    weight = torch.randn(24, 32)
    layer = LowRankLinear(32, 24, rank=24)
    u, s, vh = torch.linalg.svd(weight, full_matrices=False)
    layer.load_factors([u * s, vh.T])
    layer.set_rank(5)
    best = (u[:, :5] * s[:5]) @ vh[:5]
    torch.testing.assert_close(layer.weight, best, atol=1e-4, rtol=1e-4)


def test_cp_reconstruct_matches_layer_weight():
    layer = _layer(rank=5)
    folded = cp_reconstruct([f.detach() for f in layer.factors])
    torch.testing.assert_close(layer.folded_weight(), folded.to(layer.weight.dtype), atol=1e-6, rtol=1e-6)
