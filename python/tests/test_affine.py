"""VectorQuantize(affine_param=True) beside vector_quantize_pytorch's. lockstep's forward does not
communicate, so each call searches with the batch statistics through the last update and its own
statistics join in the update (in backward): the reference, given the same timing (its statistics
update moved from before the search to the EMA step), gives the same results step after step. On 2
processes the statistics are the global batch's: ranks identical and equal to one process."""
import pytest
import torch

import lockstep
from ranks import run_ranks, state_with_steps
from reference_steps import backward_and_compare_gradients

vqp = pytest.importorskip("vector_quantize_pytorch")


def _with_lockstep_timing(reference):
    """The reference's codebook with its affine statistics updated at the EMA step (after the search)
    and the first search unmoved: what lockstep computes (docs/python/vq.md, affine_param)."""
    codebook = reference._codebook
    update_affine, track = codebook.update_affine, codebook.track_cluster_size_and_embed_avg
    shape = codebook.codebook_mean.shape
    for name, value in (("batch_mean", 0.0), ("batch_variance", 1.0), ("codebook_mean", 0.0),
                        ("codebook_variance", 1.0)):
        codebook.register_buffer(name, torch.full(shape, value))  # the identity move for the first search
    first = [True]

    def track_after_updating(flatten, embed_onehot, mask=None, ema_update_weight=None, accum_ema_update=False):
        if first[0]:  # the reference sets its batch statistics from the first batch when they are None
            codebook.register_buffer("batch_mean", None)
            codebook.register_buffer("batch_variance", None)
            first[0] = False
        update_affine(flatten, codebook.embed, mask=mask)
        return track(flatten, embed_onehot, mask, ema_update_weight, accum_ema_update)

    codebook.update_affine = lambda data, embed, mask=None: None
    codebook.track_cluster_size_and_embed_avg = track_after_updating
    return reference


AFFINE_STATE = ("_codebook.batch_mean", "_codebook.batch_variance", "_codebook.codebook_mean",
                "_codebook.codebook_variance")
CASES = {
    "plain": dict(dim=6, codebook_size=16),
    "decays_and_projection": dict(dim=6, codebook_size=16, codebook_dim=4, affine_param_batch_decay=0.5,
                                  affine_param_codebook_decay=0.7, rotation_trick=False),
    "separate_heads": dict(dim=8, codebook_size=8, heads=2, separate_codebook_per_head=True),
}


# Masked with one codebook and no projection only: the reference's masked commitment loss fails with
# projections or heads (docs/python/vq.md, "Padded sequences").
@pytest.mark.parametrize("case, masked", [(case, False) for case in sorted(CASES)] + [("plain", True)])
def test_affine_param_matches_the_reference_with_lockstep_s_timing(case, masked):
    options = dict(CASES[case], affine_param=True, decay=0.9)
    torch.manual_seed(0)
    reference = vqp.VectorQuantize(**options)
    ours = lockstep.VectorQuantize(**options)
    ours.load_reference_state_dict(reference.state_dict())  # before a forward: no batch statistics yet
    assert float(ours._codebook.affine_initted) == 0
    _with_lockstep_timing(reference)
    lens = torch.tensor([5, 2, 5]) if masked else None
    for step in range(4):
        x = torch.randn(3, 5, options["dim"]) * (1 + step) + step  # moving statistics
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, loss_ref = reference(xs[0], lens=lens)
        out, idx, loss = ours(xs[1], lens=lens)
        assert torch.equal(idx, idx_ref), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
        # (the statistics and the EMA update run in this backward)
        backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss, step=step)
        state, expected = ours.state_dict(), reference.state_dict()
        for key in ("_codebook.embed", "_codebook.embed_avg", "_codebook.cluster_size", *AFFINE_STATE):
            torch.testing.assert_close(state[key], expected[key], atol=1e-5, rtol=1e-5, msg=f"step {step}: {key}")
    # Evaluation moves nothing (the reference also folds an evaluation batch's statistics in).
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.eval()
    ours(torch.randn(3, 5, options["dim"]) + 10)
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())


def test_the_reference_s_own_timing_differs_and_its_state_loads():
    options = dict(dim=6, codebook_size=16, affine_param=True)
    torch.manual_seed(0)
    reference, ours = vqp.VectorQuantize(**options), lockstep.VectorQuantize(**options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(4, 5, 6) * 3 + 2
    out_ref, _, _ = reference(x)  # the reference searches codes moved to this batch's statistics
    out, _, _ = ours(x)  # lockstep's first search: no statistics yet
    assert (out - out_ref).abs().max() > 1e-2
    ours.load_reference_state_dict(reference.state_dict())  # after its forward: statistics set
    assert float(ours._codebook.affine_initted) == 1
    for key in AFFINE_STATE:
        torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key])
    with pytest.raises(ValueError, match="cosine"):
        lockstep.VectorQuantize(dim=6, codebook_size=16, affine_param=True, use_cosine_sim=True)


OPTIONS = dict(dim=6, codebook_size=16, affine_param=True, decay=0.9, threshold_ema_dead_code=0.5, seed=4)


def _ranks(rank, world, data, lens):
    vq = lockstep.VectorQuantize(**OPTIONS, collective_timeout=20.0)
    for x, length in zip(data, lens):
        out, _, loss = vq(x.chunk(world)[rank], lens=length.chunk(world)[rank])
        (out.sum() + loss).backward()
    return state_with_steps(vq)


def test_two_ranks_hold_the_global_batch_s_statistics():
    data = torch.randn(3, 4, 5, 6) * 2 + 1
    lens = torch.tensor([[5, 3, 0, 0], [5, 5, 5, 1], [2, 0, 4, 5]])  # a rank of padding only at step 0
    one = lockstep.VectorQuantize(**OPTIONS)
    for x, length in zip(data, lens):
        out, _, loss = one(x, lens=length)
        (out.sum() + loss).backward()
    states = run_ranks(2, _ranks, data, lens)
    for key, value in one.state_dict().items():
        assert torch.equal(states[0][key], states[1][key]), key
        torch.testing.assert_close(states[0][key], value, atol=1e-5, rtol=1e-5, msg=key)
    assert not states[0]["_codebook.codebook_mean_needs_init"]  # the reference's flag: the statistics are set


@pytest.mark.parametrize("options, forward", [(dict(learnable_codebook=True, ema_update=False), {}),
                                              ({}, dict(freeze_codebook=True))],
                         ids=["learnable_codebook", "frozen"])
def test_the_statistics_follow_training_calls_that_leave_the_codebook_to_others(options, forward):
    # The reference updates its affine statistics in every forward, whether or not its EMA moves the codebook.
    vq = lockstep.VectorQuantize(dim=6, codebook_size=16, affine_param=True, **options)
    before = vq._codebook.embed.detach().clone()
    out, _, loss = vq(torch.randn(3, 5, 6) * 2 + 1, **forward)
    (out.sum() + loss).backward()
    assert float(vq._codebook.affine_initted) == 1
    assert not torch.equal(vq._codebook.batch_mean, torch.zeros_like(vq._codebook.batch_mean))
    assert torch.equal(vq._codebook.embed.detach(), before)  # the codebook moves only by its optimizer
