"""lockstep.FSP beside vector_quantize_pytorch.FSP from the same state and inputs; its perturbation
drawn from (seed, step) and each element's global position; its regulariser over the global batch
on 2 real processes."""
import pytest
import torch

import lockstep
from ranks import run_ranks
from reference_steps import backward_and_compare_gradients

vqp = pytest.importorskip("vector_quantize_pytorch")

CASES = {
    "tanh_projected": dict(levels=[8, 5, 5], dim=6),
    "sigmoid_inverse_kurt": dict(levels=[5, 4], act_name="sigmoid", need_inv_act=True, vector_norm="kurt",
                                 dim=3),
    "normal_var": dict(levels=[7, 6, 5], act_name="normal", vector_norm="var"),
    "laplace_inverse_no_bias": dict(levels=[4, 4, 4], act_name="laplace", need_inv_act=True, dim=5,
                                    projection_has_bias=False, vector_norm="var_laplace"),
    "cauchy_none": dict(levels=[6, 3], act_name="cauchy", vector_norm="none"),
}


def _pair(options):
    torch.manual_seed(0)
    reference = vqp.FSP(**options)
    ours = lockstep.FSP(**options)
    ours.load_state_dict(reference.state_dict())  # the projections; levels and basis are constants
    return reference, ours


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("training", [True, False])
def test_matches_the_reference_over_steps(case, training):
    # quantize_rate=1 draws nothing in training: the reference's results, over 3 SGD steps.
    options = dict(CASES[case], quantize_rate=1.0)
    reference, ours = _pair(options)
    for module in (reference, ours):
        module.train(training)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, ours)] if options.get("dim") else []
    for step in range(3):
        x = torch.randn(4, 5, options.get("dim", len(options["levels"])))
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, loss_ref, info_ref = reference(xs[0])
        out, idx, loss, info = ours(xs[1])
        assert idx.dtype == idx_ref.dtype and torch.equal(idx, idx_ref), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(info["level_indices"], info_ref["level_indices"])
        for name, value in info_ref["norm_info"].items():
            torch.testing.assert_close(info["norm_info"][name], value.detach(), atol=1e-5, rtol=1e-4)
        assert "p_accept_prob" not in info
        backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss, optimizers, rtol=1e-4,
                                       step=step)


def test_decoding_and_index_helpers_match_the_reference():
    for case in ("tanh_projected", "sigmoid_inverse_kurt", "laplace_inverse_no_bias"):
        reference, ours = _pair(CASES[case])
        indices = torch.randint(0, reference.codebook_size, (3, 7))
        torch.testing.assert_close(ours.indices_to_codes(indices), reference.indices_to_codes(indices),
                                   atol=1e-5, rtol=1e-5)
        levels = ours.indices_to_level_indices(indices)
        assert torch.equal(levels, reference.indices_to_level_indices(indices).long())
        assert torch.equal(ours.level_indices_to_indices(levels), reference.level_indices_to_indices(levels))
    channel_first = dict(levels=[5, 5, 5], dim=4, channel_first=True)
    reference, ours = _pair(channel_first)
    x = torch.randn(2, 4, 3, 3)
    reference.eval()
    ours.eval()
    out_ref, idx_ref, _, _ = reference(x)
    out, idx, _, _ = ours(x)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(ours.indices_to_codes(idx), reference.indices_to_codes(idx), atol=1e-5, rtol=1e-5)


def test_the_perturbation_stays_in_its_bin_and_is_drawn_from_seed_and_step():
    # Deliberate difference: the reference draws torch.rand_like; lockstep hashes (seed, step, place).
    options = dict(levels=[8, 8], quantize_rate=0.3)
    reference, ours = _pair(options)
    ours.seed = 3
    x = torch.randn(4, 6, 2, requires_grad=True)  # a backward may follow: the step waits for it
    reference.eval()
    expected_idx = reference(x)[1]
    out, idx, loss, info = ours(x)
    assert torch.equal(idx, expected_idx)  # the indices are never perturbed
    act = (torch.tanh(x) + 1) / 2
    moved = out * 0.28867513459481287 + 0.5 - act
    midpoint = (info["level_indices"] + 0.5) / 8
    kept = (out * 0.28867513459481287 + 0.5 - midpoint).abs() < 1e-6
    assert 0.05 < kept.float().mean() < 0.7  # about quantize_rate of the channels keep their midpoint
    assert (moved[~kept].abs() <= 1 / 16 + 1e-6).all()  # the others move by at most half a bin
    assert 0.0 < float(info["p_accept_prob"]) <= 1.0
    again = ours(x)[0]
    assert torch.equal(again, out)  # no backward between: the same step, the same draws
    (out.sum() + loss).backward()
    assert ours.step == 1 and not torch.equal(ours(x)[0], out)  # the next step draws anew


def test_bad_options_and_inputs_are_errors_naming_them():
    with pytest.raises(ValueError, match="relu"):
        lockstep.FSP(levels=[5, 5], act_name="relu")
    with pytest.raises(ValueError, match="varr"):
        lockstep.FSP(levels=[5, 5], vector_norm="varr")
    with pytest.raises(ValueError, match="quantize_rate"):
        lockstep.FSP(levels=[5, 5], quantize_rate=1.5)
    fsp = lockstep.FSP(levels=[5, 5])
    with pytest.raises(ValueError, match="dimension of 2"):
        fsp(torch.randn(2, 3, 4))
    for eps in (0.5, -1e-3):  # the clamp [eps, 1 - eps] would be empty or wider than [0, 1]
        with pytest.raises(ValueError, match=r"eps must lie in \[0, 0.5\)"):
            fsp(torch.randn(2, 3, 2), eps=eps)
        with pytest.raises(ValueError, match=r"eps must lie in \[0, 0.5\)"):
            fsp.indices_to_codes(torch.zeros(2, dtype=torch.long), eps=eps)


@pytest.mark.parametrize("need_inv_act", [False, True], ids=["standardised", "inverse"])
def test_the_clamp_epsilon_given_to_forward_and_decoding_is_the_references(need_inv_act):
    # forward(eps=) clamps activations below 1 - eps before binning (and to [eps, 1 - eps] before the
    # inverse); None and 0 are float32's machine epsilon, as the reference's `eps or finfo.eps`. With 3 levels,
    # eps > 1/3 keeps every activation out of the last bin. indices_to_codes(eps=) clamps before the inverse.
    reference, ours = _pair(dict(levels=[3, 4], dim=5, need_inv_act=need_inv_act, act_name="sigmoid",
                                 quantize_rate=1.0))  # nothing drawn in training
    x = torch.randn(4, 6, 5) * 3
    for eps in (None, 0.0, 1e-3, 0.3, 0.4):
        out_ref, idx_ref, loss_ref, info_ref = reference(x, eps=eps)
        out, idx, loss, info = ours(x, eps=eps)
        assert torch.equal(idx, idx_ref), eps
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(info["level_indices"], info_ref["level_indices"])
        if eps == 0.4:
            assert int(info["level_indices"][..., 0].max()) == 1  # the last of 3 bins unreached
        torch.testing.assert_close(ours.indices_to_codes(idx, eps=eps or 1e-6),
                                   reference.indices_to_codes(idx, eps=eps or 1e-6), atol=1e-5, rtol=1e-5)


def _ranks(rank, world, x):
    fsp = lockstep.FSP(levels=[6, 5, 4], dim=5, quantize_rate=0.5, vector_norm="kurt", seed=9, collective_timeout=20.0)
    torch.manual_seed(1)
    fsp.load_state_dict(lockstep.FSP(levels=[6, 5, 4], dim=5).state_dict())
    xi = x.chunk(world)[rank].clone().requires_grad_(True)
    out, _, loss, _ = fsp(xi)
    (out.sum() * world + loss).backward()  # the norm's statistics are summed over the ranks here
    grads = {name: p.grad.clone() for name, p in fsp.named_parameters()}
    return out.detach(), xi.grad, grads


def test_two_ranks_draw_and_regularise_as_one_process():
    x = torch.randn(4, 6, 5)
    torch.manual_seed(1)
    initial = lockstep.FSP(levels=[6, 5, 4], dim=5).state_dict()
    one = lockstep.FSP(levels=[6, 5, 4], dim=5, quantize_rate=0.5, vector_norm="kurt", seed=9)
    one.load_state_dict(initial)
    xi = x.clone().requires_grad_(True)
    out, _, loss, _ = one(xi)
    (out.sum() + loss).backward()
    ranks = run_ranks(2, _ranks, x)
    torch.testing.assert_close(torch.cat([r[0] for r in ranks]), out.detach(), atol=0, rtol=0)  # the same draws
    # Each rank's input gradient is the global batch's times the world size (DDP's mean restores it).
    torch.testing.assert_close(torch.cat([r[1] for r in ranks]) / 2, xi.grad, atol=1e-6, rtol=1e-5)
    for name, parameter in one.named_parameters():
        mean = (ranks[0][2][name] + ranks[1][2][name]) / 2
        torch.testing.assert_close(mean, parameter.grad, atol=1e-5, rtol=1e-5)
