"""Forward arguments of vector-quantize-pytorch's classes that change one call: sample_codebook_temp (VQ's
sampling temperature for the call), rand_quantize_dropout_fixed_seed (the residual stacks' dropped layers
picked by random.Random(seed), as the reference picks them) and codebook_transform_fn (each token's own
codes, from a function of the codebook)."""
import copy

import pytest
import torch

import lockstep
from reference_steps import compare_call

vqp = pytest.importorskip("vector_quantize_pytorch")


def _sampling_vq(temperature, **options):
    return lockstep.VectorQuantize(dim=8, codebook_size=32, stochastic_sample_codes=True,
                                   sample_codebook_temp=temperature, seed=7, **options)


@pytest.mark.parametrize("topk", [None, 3], ids=["codes", "topk"])
def test_a_calls_sampling_temperature_is_a_module_made_with_it(topk):
    """A call at temperature t samples what a module made with t samples (same seed and step), and not what
    the module's own temperature samples."""
    x = torch.randn(2, 50, 8)
    made_with, other = _sampling_vq(0.3), _sampling_vq(2.0)
    other.load_state_dict(made_with.state_dict())
    expected = made_with(x, topk=topk)[1]
    assert torch.equal(other(x, topk=topk, sample_codebook_temp=0.3)[1], expected)
    assert not torch.equal(other(x, topk=topk)[1], expected)  # its own temperature draws otherwise


def test_a_zero_temperature_takes_the_nearest_codes_as_the_reference():
    torch.manual_seed(0)
    reference = vqp.VectorQuantize(dim=8, codebook_size=32, stochastic_sample_codes=True, sample_codebook_temp=1.0)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=32, stochastic_sample_codes=True, sample_codebook_temp=1.0)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 50, 8)
    assert torch.equal(ours(x, sample_codebook_temp=0.0)[1], reference(x, sample_codebook_temp=0.0)[1])
    with pytest.raises(ValueError, match="sample_codebook_temp"):
        ours(x, sample_codebook_temp=-1.0)


def test_a_residual_stacks_layers_take_the_calls_temperature():
    x = torch.randn(2, 30, 8)
    made = [lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, stochastic_sample_codes=True,
                                sample_codebook_temp=t, seed=3) for t in (0.3, 2.0)]
    made[1].load_state_dict(made[0].state_dict())
    expected = made[0](x)[1]
    assert torch.equal(made[1](x, sample_codebook_temp=0.3)[1], expected)
    assert not torch.equal(made[1](x)[1], expected)


def test_a_per_call_temperature_runs_eagerly_only():
    compiled = torch.compile(_sampling_vq(1.0), fullgraph=True)
    with pytest.raises(Exception, match="sample_codebook_temp"):
        compiled(torch.randn(2, 5, 8), sample_codebook_temp=0.5)


STACKS = {
    "ResidualVQ": (vqp.ResidualVQ, lockstep.ResidualVQ, dict(dim=8, num_quantizers=6, codebook_size=16), (2, 10, 8)),
    "ResidualFSQ": (vqp.ResidualFSQ, lockstep.ResidualFSQ, dict(levels=[5, 5], num_quantizers=6, dim=8), (2, 10, 8)),
    "ResidualLFQ": (vqp.ResidualLFQ, lockstep.ResidualLFQ, dict(dim=4, num_quantizers=6, codebook_size=16),
                    (2, 10, 4)),
}


@pytest.mark.parametrize("name", STACKS)
@pytest.mark.parametrize("multiple_of", [1, 4])
def test_a_fixed_dropout_seed_drops_the_layers_the_references_does(name, multiple_of):
    reference_class, ours_class, options, shape = STACKS[name]
    options = dict(options, quantize_dropout=True, quantize_dropout_cutoff_index=1,
                   quantize_dropout_multiple_of=multiple_of)
    torch.manual_seed(0)
    reference, ours = reference_class(**options), ours_class(**options)
    x = torch.randn(*shape)
    kept = set()
    for seed in range(12):
        expected = reference(x, rand_quantize_dropout_fixed_seed=seed)[1]
        got = ours(x, rand_quantize_dropout_fixed_seed=seed)[1]
        assert torch.equal(got == -1, expected == -1), seed  # the same layers dropped
        kept.add(int((got[0, 0] != -1).sum()))
    assert len(kept) > 1  # the seeds picked different depths


class _PerTokenCodes(torch.nn.Module):
    """A function of the codebook giving each token its own codes, as the reference's codebook_transform_fn
    (its ResidualVQ passes an MLP conditioned on the codes before): a learned map of the codes plus a
    per-token offset, (1, K, d) -> (1, b, n, K, d)."""

    def __init__(self, condition):
        super().__init__()
        self.map = torch.nn.Linear(condition.shape[-1], condition.shape[-1])
        self.condition = condition  # (b, n, d)

    def forward(self, codebook):
        return self.map(codebook)[:, None, None] + 0.3 * self.condition[None, :, :, None]


@pytest.mark.parametrize("options, shape, condition", [
    (dict(), (2, 10, 8), (2, 10, 8)),
    (dict(learnable_codebook=True, ema_update=False), (2, 10, 8), (2, 10, 8)),
    (dict(use_cosine_sim=True), (2, 10, 8), (2, 10, 8)),
    (dict(codebook_dim=4), (2, 10, 8), (2, 10, 4)),  # through the projections in and out
    (dict(accept_image_fmap=True), (2, 8, 2, 5), (2, 10, 8)),  # a map's positions are its tokens
    (dict(), (2, 8), (2, 1, 8)),  # one token per item
    # the codebook through the bridge first, then the function
    (dict(vq_bridge=torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())), (2, 10, 8), (2, 10, 8)),
    # heads: each head's own codes, (heads, b, n, K, d) with separate codebooks, else (1, b * heads, n, K, d)
    (dict(heads=2, separate_codebook_per_head=True, codebook_dim=4), (2, 10, 8), (2, 10, 4)),
    (dict(heads=2, codebook_dim=4), (2, 10, 8), (4, 10, 4)),
    # the diversity loss over each token's own codes (a learned codebook: the reference's EMA step writes the
    # codebook its gradient is then taken at, docs/python/vq.md)
    (dict(learnable_codebook=True, ema_update=False, codebook_diversity_loss_weight=0.3), (2, 10, 8), (2, 10, 8)),
    (dict(heads=2, codebook_dim=4, learnable_codebook=True, ema_update=False, codebook_diversity_loss_weight=0.3),
     (2, 10, 8), (4, 10, 4)),
], ids=["ema", "learnable", "cosine", "projected", "map", "one_token", "bridge", "heads_separate", "heads_shared",
        "diversity", "diversity_heads_shared"])
def test_a_codebook_transform_fn_gives_each_token_its_codes_as_the_reference(options, shape, condition):
    torch.manual_seed(0)
    reference = vqp.VectorQuantize(dim=8, codebook_size=16, decay=0.5, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.5, **copy.deepcopy(options))
    ours.load_reference_state_dict(reference.state_dict())
    transforms = [_PerTokenCodes(torch.randn(condition))]
    transforms.append(copy.deepcopy(transforms[0]))
    for step in range(2):
        xs = [torch.randn(shape).requires_grad_(True)]
        xs.append(xs[0].detach().clone().requires_grad_(True))
        compare_call(*(module(x, codebook_transform_fn=transform)
                       for module, x, transform in zip((reference, ours), xs, transforms)), xs, step)
        for a, b in zip(transforms[1].parameters(), transforms[0].parameters()):
            torch.testing.assert_close(a.grad, b.grad, atol=5e-5, rtol=1e-5)
        reference_parameters = dict(reference.named_parameters())
        for name, parameter in ours.named_parameters():  # projections, a learned codebook, the bridge
            assert (parameter.grad is None) == (reference_parameters[name].grad is None), name
            if parameter.grad is not None:
                torch.testing.assert_close(parameter.grad, reference_parameters[name].grad, atol=5e-5, rtol=1e-5)
        # the EMA (the base codebook's statistics of the codes chosen) after the call's backward
        torch.testing.assert_close(ours.codebook, reference.codebook, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="each token's codes"):
        ours(torch.randn(shape), codebook_transform_fn=lambda codebook: codebook)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("options, condition", [
    (dict(), (2, 10, 8)), (dict(use_cosine_sim=True), (2, 10, 8)), (dict(codebook_dim=4), (2, 10, 4)),
    (dict(learnable_codebook=True, ema_update=False), (2, 10, 8))],
    ids=["euclidean", "cosine", "projected", "learnable"])
def test_top_k_codes_of_each_tokens_own_codebook_are_the_references(options, condition, training):
    # topk with codebook_transform_fn: each token's k best among its own codes, each code's loss, as there;
    # the losses' gradients reach the input and the function's parameters.
    torch.manual_seed(1)
    reference = vqp.VectorQuantize(dim=8, codebook_size=16, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    reference.train(training), ours.train(training)
    transforms = [_PerTokenCodes(torch.randn(condition))]
    transforms.append(copy.deepcopy(transforms[0]))
    xs = [torch.randn(2, 10, 8).requires_grad_(True)]
    xs.append(xs[0].detach().clone().requires_grad_(True))
    out_ref, idx_ref, loss_ref = reference(xs[0], topk=3, ema_update=False, codebook_transform_fn=transforms[0])
    out, idx, loss = ours(xs[1], topk=3, ema_update=False, codebook_transform_fn=transforms[1])
    assert out.shape == out_ref.shape == (2, 10, 3, 8) and idx.shape == (2, 10, 3)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-6, rtol=1e-5)
    for lo in (loss_ref, loss):
        lo.sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    for a, b in zip(transforms[1].parameters(), transforms[0].parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("options, condition", [
    (dict(), (2, 10, 8)), (dict(use_cosine_sim=True), (2, 10, 8)), (dict(codebook_dim=4), (2, 10, 4))],
    ids=["euclidean", "cosine", "projected"])
def test_the_cross_entropy_of_given_codes_among_each_tokens_own_codes_is_the_references(options, condition, training):
    # indices= with codebook_transform_fn: the cross entropy of the given codes under each token's own codes'
    # logits (minus the pairwise distance, or the cosine similarity), its gradient to the input and the function.
    # Deliberate difference: the function's gradient is taken at the codebook the call used; the reference's
    # training call takes it at the codebook its EMA step then wrote (through .data, unseen by autograd), so the
    # function's gradient is compared with the reference's evaluation call, which changes nothing.
    torch.manual_seed(2)
    reference = vqp.VectorQuantize(dim=8, codebook_size=16, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    at_the_call = copy.deepcopy(reference).eval()
    reference.train(training), ours.train(training)
    transforms = [_PerTokenCodes(torch.randn(condition))]
    transforms += [copy.deepcopy(transforms[0]), copy.deepcopy(transforms[0])]
    given = torch.randint(0, 16, (2, 10))
    given[0, :2] = -1  # ignored, as there
    xs = [torch.randn(2, 10, 8).requires_grad_(True)]
    xs.append(xs[0].detach().clone().requires_grad_(True))
    _, loss_ref = reference(xs[0], indices=given, codebook_transform_fn=transforms[0])
    _, loss = ours(xs[1], indices=given, codebook_transform_fn=transforms[1])
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    loss_ref.backward(), loss.backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    at_the_call(xs[0].detach(), indices=given, codebook_transform_fn=transforms[2])[1].backward()
    for a, b in zip(transforms[1].parameters(), transforms[2].parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=5e-5, rtol=1e-5)


def test_a_codebook_transform_fn_takes_the_affine_codebook_as_the_reference():
    # affine_param: the function takes the codebook moved by the batch statistics, as the reference's; lockstep's
    # statistics are those through the last update (its timing, test_affine.py), which the reference is given.
    from test_affine import AFFINE_STATE, _with_lockstep_timing
    torch.manual_seed(3)
    options = dict(dim=8, codebook_size=16, affine_param=True, decay=0.9)
    reference = vqp.VectorQuantize(**options)
    ours = lockstep.VectorQuantize(**options)
    ours.load_reference_state_dict(reference.state_dict())
    _with_lockstep_timing(reference)
    transforms = [_PerTokenCodes(torch.randn(3, 5, 8))]
    transforms.append(copy.deepcopy(transforms[0]))
    for step in range(3):
        x = torch.randn(3, 5, 8) * (1 + step) + step  # moving statistics
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        compare_call(reference(xs[0], codebook_transform_fn=transforms[0]),
                     ours(xs[1], codebook_transform_fn=transforms[1]), xs, step)
        state, expected = ours.state_dict(), reference.state_dict()
        for key in ("_codebook.embed", "_codebook.embed_avg", *AFFINE_STATE):
            torch.testing.assert_close(state[key], expected[key], atol=1e-5, rtol=1e-5, msg=f"step {step}: {key}")
