"""The failure modes lockstep's Python package must rule out, on real processes (torch.distributed
with Gloo on CPU, a file rendezvous, a hard time limit each)."""
import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks, state_with_steps


def _bucket_epochs(rank, world, bucket_ids, epochs):
    from lockstep.data import BucketBatchSampler

    sampler = BucketBatchSampler(bucket_ids, global_batch_size=12, seed=3)  # world and rank from torch.distributed
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            # Every step is a collective, as a training step's gradient sync is: a rank with fewer
            # batches would leave the others waiting here. The buckets are compared on the way.
            bucket = torch.tensor([bucket_ids[batch[0]]])
            gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(gathered, bucket)
            assert len({int(g) for g in gathered}) == 1, f"ranks at different buckets: {gathered}"
            assert all(bucket_ids[i] == int(bucket) for i in batch)
            seen.append((epoch, len(batch)))
    return seen


@pytest.mark.parametrize("world", [2, 3])
def test_the_bucket_sampler_keeps_ranks_in_step_over_uneven_buckets(world):
    bucket_ids = [0] * 37 + [1] * 21 + [2] * 14  # 3, 1 and 1 global batches of 12, remainders dropped
    results = run_ranks(world, _bucket_epochs, bucket_ids, 3)
    steps = [len(r) for r in results]
    assert len(set(steps)) == 1 and steps[0] == 3 * (3 + 1 + 1)
    for step in range(steps[0]):
        assert sum(r[step][1] for r in results) == 12  # the ranks' parts make one global batch


def _lfq_half_batches(rank, world, x, evaluate_on_rank0):
    import lockstep

    torch.manual_seed(0)
    lfq = lockstep.LFQ(codebook_size=2**6, commitment_loss_weight=0.25)
    part = x.chunk(world)[rank].clone().requires_grad_(True)
    results = []
    for step in range(3):
        if evaluate_on_rank0 and rank == 0 and step == 1:
            lfq.eval()  # rank 0 alone validates mid-training: no collective may be issued
            with torch.no_grad():
                lfq(part)
            lfq.train()
        out, indices, aux = lfq(part)
        part.grad = None
        aux.backward()  # the codebook entropy's reduction over the ranks rides on this backward
        results.append((out.detach(), indices, float(aux), part.grad.clone()))
    return results


@pytest.mark.parametrize("evaluate_on_rank0", [False, True])
def test_lfq_on_two_ranks_gives_one_process_s_gradients(evaluate_on_rank0):
    import lockstep

    x = torch.randn(4, 30, 6)
    one = lockstep.LFQ(codebook_size=2**6, commitment_loss_weight=0.25)
    whole = x.clone().requires_grad_(True)
    out, indices, aux = one(whole)
    aux.backward()
    # a forward never communicates: the loss a rank sees is its own batch's, as one process computes it
    halves = [float(one(x.chunk(2)[r])[2].detach()) for r in range(2)]
    ranks = run_ranks(2, _lfq_half_batches, x, evaluate_on_rank0)
    for step in range(3):
        for r in range(2):
            assert ranks[r][step][2] == pytest.approx(halves[r], rel=1e-5, abs=1e-6)
        torch.testing.assert_close(torch.cat([ranks[r][step][0] for r in range(2)]), out.detach())
        assert torch.equal(torch.cat([ranks[r][step][1] for r in range(2)]), indices)
        # the gradient is the global batch's: averaged over the ranks as DDP averages, one process's
        torch.testing.assert_close(torch.cat([ranks[r][step][3] for r in range(2)]) / 2, whole.grad,
                                   atol=1e-6, rtol=1e-5)


def _rank1_never_trains(rank, world):
    import lockstep

    lfq = lockstep.LFQ(codebook_size=2**4, collective_timeout=3.0)
    if rank == 1:
        time.sleep(8)  # alive, but never reaches the collective
        return "silent"
    start = time.time()
    try:
        lfq(torch.randn(2, 5, 4))[2].backward()  # the forward alone returns: its reduction is in backward
    except lockstep.CollectiveFailure as e:
        return (time.time() - start, str(e))
    return "no error"


def test_a_rank_that_never_arrives_is_named_at_the_timeout():
    seconds, message = run_ranks(2, _rank1_never_trains)[0]
    assert "rank(s) 1" in message and "lfq.avg_probs" in message, message
    assert seconds < 30, seconds  # the 3 s timeout, with generous slack for a loaded machine


def _vq_half_batches(rank, world, x, initial, evaluate_on_rank0):
    import lockstep

    vq = lockstep.VectorQuantize(dim=8, codebook_size=32, decay=0.9)
    vq.load_state_dict(initial)
    part = x.chunk(world, dim=1)[rank]
    for step in range(3):
        if evaluate_on_rank0 and rank == 0 and step == 1:
            vq.eval()  # rank 0 alone validates: no collective, the codebook untouched
            with torch.no_grad():
                vq(part[step])
            vq.train()
        out, _, loss = vq(part[step])
        (out.sum() + loss).backward()  # the EMA update, and its reduction over the ranks, ride on backward
    return vq.state_dict()["_codebook.embed"]


@pytest.mark.parametrize("evaluate_on_rank0", [False, True])
def test_vq_codebooks_stay_identical_and_equal_one_process_s(evaluate_on_rank0):
    import lockstep

    x = torch.randn(3, 2, 60, 8)  # 3 steps of a batch of 2 sequences
    one = lockstep.VectorQuantize(dim=8, codebook_size=32, decay=0.9)
    initial = {k: v.clone() for k, v in one.state_dict().items()}
    for step in range(3):
        out, _, loss = one(x[step])
        (out.sum() + loss).backward()
    codebooks = run_ranks(2, _vq_half_batches, x, initial, evaluate_on_rank0)  # rank r: sequence r of each step
    assert torch.equal(codebooks[0], codebooks[1])  # the ranks never diverge
    torch.testing.assert_close(codebooks[0], one.state_dict()["_codebook.embed"], atol=1e-5, rtol=1e-5)


def _unsynced(options):
    import lockstep

    if "num_quantizers" in options:
        return lockstep.ResidualVQ(dim=8, codebook_size=16, decay=0.9, sync_codebook=False, kmeans_init=True,
                                   **options)
    return lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9, sync_codebook=False, kmeans_init=True,
                                   **options)


def _unsynced_ranks(rank, world, x, initial, options):
    vq = _unsynced(options)
    vq.load_state_dict(initial)
    for step in range(3):
        out, _, loss = vq(x[step].chunk(world)[rank])
        (out.sum() + loss.sum()).backward()
    return {k: v.clone() for k, v in vq.state_dict().items()}


@pytest.mark.parametrize("options", [dict(), dict(threshold_ema_dead_code=1.0), dict(num_quantizers=2)],
                         ids=["vq", "dead_codes", "residual"])
def test_sync_codebook_false_keeps_each_rank_s_statistics_its_own(options):
    """sync_codebook=False: every statistic, k-means and dead codes included, is the rank's alone (the
    reference's meaning), so each rank ends where one process training on that rank's batches ends."""
    x = torch.randn(3, 4, 30, 8)
    initial = {k: v.clone() for k, v in _unsynced(options).state_dict().items()}
    alone = []
    for rank in range(2):
        vq = _unsynced(options)
        vq.load_state_dict(initial)
        for step in range(3):
            out, _, loss = vq(x[step].chunk(2)[rank])
            (out.sum() + loss.sum()).backward()
        alone.append(vq.state_dict())
    ranks = run_ranks(2, _unsynced_ranks, x, initial, options)
    for rank in range(2):
        for key, value in alone[rank].items():
            torch.testing.assert_close(ranks[rank][key], value, atol=1e-5, rtol=1e-5, msg=f"rank {rank}: {key}")
    embed = next(k for k in alone[0] if k.endswith("embed"))
    assert not torch.allclose(ranks[0][embed], ranks[1][embed])  # the ranks' codebooks went their own ways


def _new_option_module(name):
    """issue #38's options, each reducing its statistics (or learning by gradient) over ranks."""
    import lockstep

    made = {
        "beam": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, beam_size=2, decay=0.8, seed=3),
        "shared": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, shared_codebook=True,
                                              decay=0.8, seed=3),
        "implicit": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16,
                                                implicit_neural_codebook=True, seed=3),
        "implicit_beam": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, beam_size=2,
                                                     implicit_neural_codebook=True, seed=3),
        "in_place": lambda: lockstep.VectorQuantize(
            dim=8, codebook_size=16, learnable_codebook=True, ema_update=False, seed=3,
            in_place_codebook_optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5)),
        "shared_in_place": lambda: lockstep.ResidualVQ(
            dim=8, num_quantizers=3, codebook_size=16, shared_codebook=True, learnable_codebook=True, ema_update=False,
            seed=3, in_place_codebook_optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5)),
        "diveq": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, diveq=True, seed=3),
        "topk_then_update": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.8, seed=3),
        "bridge_kmeans": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True, seed=3, vq_bridge=(
            torch.manual_seed(1), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()))[1]),
        "residual_bridge": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, seed=3, vq_bridge=(
            torch.manual_seed(1), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()))[1]),
        "residual_bridge_kmeans": lambda: lockstep.ResidualVQ(
            dim=8, num_quantizers=3, codebook_size=16, seed=3, kmeans_init=True,
            vq_bridge=(torch.manual_seed(1), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()))[1]),
        "lfq_rotation": lambda: lockstep.LFQ(dim=8, codebook_size=16, orthogonal_rotation=True, seed=3),
        "lfq_activation": lambda: lockstep.LFQ(dim=8, codebook_size=16, seed=3, straight_through_activation=(
            torch.manual_seed(1), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))[1]),
        "residual_lfq_activation": lambda: lockstep.ResidualLFQ(dim=8, codebook_size=16, num_quantizers=2, seed=3,
                                                                straight_through_activation=torch.nn.Tanh()),
        "manual_ema": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.8, seed=3,
                                                      manual_ema_update=True),
        "orthogonal_max_codes": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.8, seed=3,
                                                                orthogonal_reg_weight=0.5, orthogonal_reg_max_codes=5),
    }
    return made[name]()


NEW_OPTIONS = ["beam", "bridge_kmeans", "diveq", "implicit", "implicit_beam", "in_place", "lfq_activation", "lfq_rotation", "manual_ema",
               "orthogonal_max_codes", "residual_bridge", "residual_bridge_kmeans", "residual_lfq_activation", "shared", "shared_in_place",
               "topk_then_update"]


def _train_new_option(name, module, x, world=1, rank=0):
    """3 steps: each rank's share of the batch, SGD on the gradients averaged over ranks (DDP's mean)."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1) if list(module.parameters()) else None
    for step in range(3):
        part = x[step].chunk(world)[rank].clone().requires_grad_(True)
        if name == "topk_then_update":  # a top-2 search, then the EMA update with each token's best code
            out, idx, losses = module(part, topk=2)
            module.update_ema_indices(part.detach(), idx[..., 0])
            (out[..., 0, :].square().mean() + losses[..., 0].mean()).backward()
            continue
        out, _, losses = module(part)
        (out.square().mean() + losses.sum()).backward()
        if name == "manual_ema" and step > 0:  # the codebook recomputed from the global statistics on each rank
            module._codebook.update_ema()
        if optimizer is not None:
            for p in module.parameters():
                if world > 1 and p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
            optimizer.step()
            optimizer.zero_grad()
        if name == "shared_in_place":  # manual, as the reference makes it: the global batch's in-place gradient
            module.layers[0].update_in_place_optimizer()
    return state_with_steps(module)


def _new_option_ranks(rank, world, name, x):
    return _train_new_option(name, _new_option_module(name), x, world, rank)


@pytest.mark.parametrize("name", NEW_OPTIONS)
def test_issue_38_options_on_two_ranks_end_where_one_process_ends(name):
    """Beam search (its chosen paths' statistics), a shared codebook (every layer's statistics, one refresh),
    implicit neural codebooks (greedy and with beam search) and DiVeQ (learned by gradient; DiVeQ's noise keyed
    by global position), an in-place codebook optimizer (stepped in backward on the global batch's gradient), a top-k
    search then update_ema_indices, the orthogonal regulariser over max_codes codes (drawn alike on every rank),
    manual_ema_update with update_ema() between steps, LFQ's orthogonal rotation (drawn from the seed on every
    rank), a straight-through activation on projected tokens (its parameters trained) and in ResidualLFQ, k-means
    setting the codebook a vq_bridge takes (over the global batch), ResidualVQ's layers through a vq_bridge, a shared
    codebook's manual in-place update: 2 ranks with half of each batch end where one process with the whole ends."""
    x = torch.randn(3, 4, 10, 8)
    one = _train_new_option(name, _new_option_module(name), x)
    ranks = run_ranks(2, _new_option_ranks, name, x)
    for key, value in one.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), f"{name}: {key} differs between ranks"
        torch.testing.assert_close(ranks[0][key], value, atol=1e-5, rtol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def _uneven_batches(rank, world, make_name):
    import lockstep

    makers = {
        "fsq_noise": lambda: lockstep.FSQ(levels=[8, 5, 5, 5], noise_dropout=0.5, preserve_symmetry=True),
        "lfq_subset": lambda: lockstep.LFQ(codebook_size=2**6, frac_per_sample_entropy=0.5),
        "vq_stochastic": lambda: lockstep.VectorQuantize(dim=4, codebook_size=16, stochastic_sample_codes=True,
                                                         sample_codebook_temp=0.5),
        "vq_plain": lambda: lockstep.VectorQuantize(dim=4, codebook_size=16),
    }
    torch.manual_seed(0)
    module = makers[make_name]()
    dim = 6 if make_name == "lfq_subset" else 4
    x = torch.randn(5 if rank == 0 else 3, 7, dim, generator=torch.Generator().manual_seed(rank))
    out, indices, *aux = module(x.requires_grad_(True))
    loss = out.sum() + sum(a.sum() for a in aux if torch.is_tensor(a))
    try:
        loss.backward()
    except ValueError as e:
        return str(e)
    return "trained"


@pytest.mark.parametrize("make_name", ["fsq_noise", "lfq_subset", "vq_stochastic"])
def test_uneven_batches_with_per_token_draws_are_refused_on_every_rank(make_name):
    # Draws are keyed by rank x local batch: with 5 items on rank 0 and 3 on rank 1 they would overlap and
    # shift silently (issue #37 item 7). Every rank names every rank's batch in backward.
    results = run_ranks(2, _uneven_batches, make_name)
    for message in results:
        assert "rank 0: 5 items, rank 1: 3 items" in message, message
        assert "same batch size" in message, message


def test_uneven_batches_without_per_token_draws_still_train():
    assert run_ranks(2, _uneven_batches, "vq_plain") == ["trained", "trained"]
