"""Training that never runs a backward (issue #47 item 3). On one process a training forward that nothing
can backward (grad mode off, or no input or parameter that requires grad) is a whole step, as in the
reference: the codebook learns by EMA alone and the draws advance. On several ranks forward stays free of
collectives unless lockstep.update_in_forward(model) asks for it, and a module whose training forwards no
backward reaches says so, once."""
import warnings

import pytest
import torch
import torch.utils.checkpoint
import vector_quantize_pytorch as vqp

import lockstep
from ranks import run_ranks

OPTIONS = dict(dim=8, codebook_size=16, decay=0.8)


def twins(**options):
    reference = vqp.VectorQuantize(**{**OPTIONS, **options})
    ours = lockstep.VectorQuantize(**{**OPTIONS, **options})
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


def batches(count=4, shape=(2, 12, 8), seed=3):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * 2 + 1 for _ in range(count)]


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "input_without_grad"])
def test_ema_alone_learns_on_one_process_as_the_references(how):
    reference, ours = twins()
    for x in batches():
        for module in (reference, ours):
            if how == "no_grad":
                with torch.no_grad():
                    module(x)
            elif how == "inference_mode":
                with torch.inference_mode():
                    module(x)
            else:  # a VQ without projections has no parameter: nothing here can be backwarded
                module(x)
    assert not torch.equal(ours._codebook.embed, lockstep.VectorQuantize(**OPTIONS)._codebook.embed)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)
    assert ours.step == 4  # the draws advance with each whole step


def test_frozen_features_train_a_projected_codebook_under_no_grad():
    # A projection is a parameter that requires grad, but no_grad means no backward can come.
    reference, ours = twins(codebook_dim=4)
    for x in batches():
        for module in (reference, ours):
            with torch.no_grad():
                module(x)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("projected", [False, True], ids=["plain", "projected"])
@pytest.mark.parametrize("weight", ["tensor", "callable", "accumulate"])
def test_the_forward_time_ema_arguments_move_the_codebook_in_forward_as_the_references(weight, projected):
    # With projections (parameters a backward could reach) too: these arguments describe this forward's update.
    reference, ours = twins(**(dict(codebook_dim=4) if projected else {}))
    for x in batches(count=3):
        if weight == "tensor":
            call = dict(ema_update_weight=torch.rand(16, generator=torch.Generator().manual_seed(1)))
        elif weight == "callable":
            call = dict(ema_update_weight=lambda embed_sum, cluster_size: 0.5)  # a number, as the reference takes
        else:
            call = dict(accum_ema_update=True)
        for module in (reference, ours):
            module(x, **call)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)
    if weight == "accumulate":  # the next plain call applies what the calls held back, as the reference's
        x = batches(count=1, seed=9)[0]
        for module in (reference, ours):
            module(x)
        for key, value in reference.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_sampled_entropy_draws_anew_at_each_forward_without_a_backward():
    lfq = lockstep.LFQ(dim=4, codebook_size=16, frac_per_sample_entropy=0.5, entropy_loss_weight=1.0, seed=2)
    x = torch.randn(2, 64, 4, generator=torch.Generator().manual_seed(0))
    losses = {float(lfq(x)[2].detach()) for _ in range(10)}
    assert lfq.step == 10
    assert len(losses) > 1  # each call's sample of tokens is its own step's


def test_a_forward_a_backward_could_follow_still_updates_in_backward():
    reference, ours = twins(codebook_dim=4)  # projections that require grad
    x = batches(count=1)[0].requires_grad_(True)
    before = ours._codebook.embed.clone()
    out, _, loss = ours(x)
    assert torch.equal(ours._codebook.embed, before) and ours.step == 0
    (out.sum() + loss).backward()
    assert not torch.equal(ours._codebook.embed, before) and ours.step == 1


def test_training_forwards_no_backward_reaches_are_named_once_with_the_way_out():
    vq = lockstep.VectorQuantize(**OPTIONS, codebook_dim=4)
    x = batches(count=1)[0].requires_grad_(True)  # a loss that never reaches the quantizer: no backward comes
    with pytest.warns(RuntimeWarning, match="update_in_forward"):
        for _ in range(10):
            vq(x)  # each output freed at once, never backwarded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            vq(x)  # once per module
    assert vq.step == 0
    lockstep.update_in_forward(vq)
    vq(x)
    assert vq.step == 1  # the way out: a whole step in forward


def test_many_calls_backwarded_together_are_not_named():
    # One call per frame, their losses summed, one backward: every call was backwarded.
    vq = lockstep.VectorQuantize(**OPTIONS, codebook_dim=4)
    frames = [x.requires_grad_(True) for x in batches(count=12)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            outputs = [vq(frame) for frame in frames]
            sum(out.sum() + loss for out, _, loss in outputs).backward()
            del outputs
    assert vq.step == 24


@pytest.mark.parametrize("reentrant", [True, False])
def test_an_activation_checkpoint_makes_one_step(reentrant):
    # A reentrant checkpoint runs forward under no_grad with inputs that require grad, then again in backward:
    # the step is the backward's, once, as without the checkpoint.
    vq = lockstep.VectorQuantize(**OPTIONS, codebook_dim=4)
    plain = lockstep.VectorQuantize(**OPTIONS, codebook_dim=4)
    plain.load_state_dict(vq.state_dict())
    x = batches(count=1)[0].requires_grad_(True)
    out, _, loss = torch.utils.checkpoint.checkpoint(vq, x, use_reentrant=reentrant)
    (out.sum() + loss).backward()
    out, _, loss = plain(x)
    (out.sum() + loss).backward()
    assert vq.step == plain.step == 1
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(vq.state_dict()[key], value, msg=key)


def test_update_in_forward_trains_as_the_reference_with_a_loss_that_does_not_reach_the_quantizer():
    reference, ours = twins(codebook_dim=4)
    lockstep.update_in_forward(ours)
    for x in batches():
        x = x.requires_grad_(True)
        for module in (reference, ours):
            module(x)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)


def _ema_only_ranks(rank, world, data, explicit, preview):
    torch.manual_seed(0)
    vq = lockstep.VectorQuantize(**OPTIONS, collective_timeout=20.0)
    if explicit:
        lockstep.update_in_forward(vq)
    with torch.no_grad():
        for x in data:
            if preview and rank == 0:  # rank 0 alone: a training-mode preview of another batch
                lockstep.update_in_forward(vq, False)
                vq(x[:1] * 3)
                lockstep.update_in_forward(vq, explicit)
            vq(x.chunk(world)[rank])
    return {k: v.clone() for k, v in vq.state_dict().items()}, vq.step


def test_two_ranks_train_by_ema_alone_through_update_in_forward_as_one_process_on_the_whole_batch():
    data = batches(count=3, shape=(4, 12, 8))
    torch.manual_seed(0)
    one = lockstep.VectorQuantize(**OPTIONS)
    with torch.no_grad():
        for x in data:
            one(x)
    (state0, step0), (state1, step1) = run_ranks(2, _ema_only_ranks, data, True, False)
    assert step0 == step1 == 3
    for key, value in one.state_dict().items():
        assert torch.equal(state0[key], state1[key]), key
        torch.testing.assert_close(state0[key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_on_two_ranks_a_forward_stays_local_by_default_and_a_rank_0_preview_changes_nothing():
    data = batches(count=3, shape=(4, 12, 8))
    torch.manual_seed(0)
    initial = lockstep.VectorQuantize(**OPTIONS).state_dict()
    (state0, step0), (state1, step1) = run_ranks(2, _ema_only_ranks, data, False, True)
    assert step0 == step1 == 0
    for key, value in initial.items():
        assert torch.equal(state0[key], value) and torch.equal(state1[key], value), key


def test_with_update_in_forward_a_forward_on_rank_0_alone_is_named_there_never_a_hang():
    # The explicit way asks every rank to make each training forward: rank 0's extra one pairs with rank 1's
    # next (the same collectives: that pairing no fingerprint can tell, docs/python/vector-quantize-pytorch.md),
    # and rank 0's last update finds no partner: it is named there, with the rank that stopped, instead of
    # waiting forever.
    message, done = run_ranks(2, _preview_on_rank_0)
    assert "rank 1" in message, message
    assert done == "no error"


def _preview_on_rank_0(rank, world):
    torch.manual_seed(0)
    vq = lockstep.VectorQuantize(**OPTIONS, collective_timeout=10.0)
    lockstep.update_in_forward(vq)
    try:
        with torch.no_grad():
            if rank == 0:
                vq(torch.randn(1, 5, 8))  # a preview, on rank 0 alone
            vq(torch.randn(2, 12, 8))
            vq(torch.randn(2, 12, 8))
    except (lockstep.CollectiveMismatch, lockstep.CollectiveFailure) as error:
        return str(error)
    return "no error"


def test_a_whole_step_returns_the_references_cross_entropy_and_state():
    # The cross entropy takes the codes as the call searched them, before the update the step makes in forward.
    reference, ours = twins(commitment_use_cross_entropy_loss=True)
    for x in batches():
        with torch.no_grad():
            _, indices_ref, loss_ref = reference(x)
            _, indices, loss = ours(x)
        assert torch.equal(indices, indices_ref)
        torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("cross_entropy", [False, True])
def test_a_whole_step_initialises_by_k_means_first(cross_entropy):
    # k-means draws its samples from (seed, step) here, from torch's generator there: the reference is given
    # lockstep's initialised codebook, and the first call's results must then be its.
    reference, ours = twins(kmeans_init=True, kmeans_iters=3, commitment_use_cross_entropy_loss=cross_entropy)
    x = batches(count=1)[0]
    with torch.no_grad():
        _, indices, loss = ours(x)
    assert bool(ours._codebook.initted) and ours.step == 1
    assert float(ours._codebook.embed.abs().sum()) > 0  # k-means set it from the batch
    with torch.no_grad():  # lockstep's k-means result before its EMA update: the reference, initialised so
        found = lockstep.VectorQuantize(**OPTIONS, kmeans_init=True, kmeans_iters=3, seed=ours.seed)
        found.load_state_dict(reference.state_dict())
        found._core.initialise(x, True, ours.seed, torch.tensor(0), None, None)
    reference.load_state_dict(found.state_dict())
    with torch.no_grad():
        _, indices_ref, loss_ref = reference(x)
    assert torch.equal(indices, indices_ref)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
