"""lockstep.distributed (issue #24): a training loop's every collective checked by lockstep's channel.
Each scenario of checked_scenarios.py runs on 2 real processes (torchrun, or Lightning's own launcher)
with a hard time limit; the test reads what each rank stopped with and checks that it is lockstep's
error, raised fast, naming both ranks' calls and their call sites (file:line)."""
import os
import re
import sys
import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_launched, run_ranks, state_with_steps

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checked_scenarios.py")
TIME_LIMIT = 120  # seconds per run; the whole process group is killed after it
FAST = 60  # the whole run, processes' start included: well before any timeout torch or lockstep would hit
QUICK = 10  # from the scenario's start to a rank's error: typically under a second; 10 on a loaded machine
DEAD = 15  # a rank that stopped is named once its heartbeat has been silent for ~2 s


def _site(marker):
    """'checked_scenarios.py:LINE' of the line whose `# site:` comment is `marker`."""
    with open(SCRIPT) as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# site: {marker}"):
                return f"checked_scenarios.py:{number})"
    raise AssertionError(f"no line marked {marker!r} in {SCRIPT}")


ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _run(scenario, out, lightning=False, accelerate=False):
    command = [sys.executable] if lightning else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc-per-node", "2"]
    command = ACCELERATE if accelerate else command
    start = time.monotonic()
    _, output = run_launched(command + [SCRIPT, scenario, str(out)], out, TIME_LIMIT)
    seconds = time.monotonic() - start
    records = {}
    for rank in range(2):
        path = out / f"rank{rank}.txt"
        if path.exists():
            records[rank] = path.read_text()
    assert 0 in records, f"{scenario}: rank 0 recorded nothing:\n{output[-3000:]}"
    return records, seconds


def _seconds(record):
    """How long the rank took from the scenario's start to its error (checked_scenarios.py records it)."""
    return float(re.search(r"^after ([0-9.]+) s$", record, re.M).group(1))


def _mismatch_names(record, calls):
    """record is a CollectiveMismatch whose rank r part holds calls[r] (a regex) and the site."""
    assert record.startswith("CollectiveMismatch: collective mismatch"), record
    for rank, (call, site) in enumerate(calls):
        part = re.search(rf"rank {rank}: (#[^;\n]*)", record)
        assert part, f"no rank {rank} in: {record}"
        assert re.search(call, part.group(1)), f"rank {rank}: {part.group(1)!r} is not {call!r}"
        assert site in part.group(1), f"rank {rank}: {part.group(1)!r} does not name {site}"


def test_a_loss_all_reduce_against_another_collective_is_a_mismatch_on_both_ranks(tmp_path):
    records, seconds = _run("user_loss_all_reduce_against_broadcast", tmp_path)
    for rank in range(2):
        _mismatch_names(records[rank], [
            (r"#2 all_reduce\(sum\) of \[float32 \(1\)\] at dist.all_reduce", _site("loss all_reduce")),
            (r"#2 broadcast\(root 0\) of \[float32 \(3\)\] at dist.broadcast", _site("broadcast"))])
        assert f"seen by rank {rank} of 2" in records[rank]
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_an_asynchronous_all_reduce_returns_before_its_check_and_sums_at_wait(tmp_path):
    """Issue #51: the check never makes an asynchronous collective synchronous. Rank 1 arrives 2 s late;
    rank 0's Work comes back at once, not completed, and wait() gives the sum once rank 1 is there."""
    records, _ = _run("async_all_reduce_returns_before_the_other_rank_arrives", tmp_path)
    for form in ("list", "tensor"):
        line = re.search(rf"^{form}: returned after ([0-9.]+) s, completed then: (\w+), waited ([0-9.]+) s, "
                         rf"sum right: (\w+)$", records[0], re.M)
        assert line, records[0]
        returned, completed, waited, right = float(line[1]), line[2], float(line[3]), line[4]
        assert returned < 0.5 and completed == "False", records[0]  # a blocking check would take ~2 s
        assert waited > 1.5 and right == "True", records[0]
    assert records[1].count("sum right: True") == 2, records[1]


def test_a_wait_with_a_timeout_on_a_predicted_all_reduce_gives_up_at_its_timeout(tmp_path):
    """Issue #51: a collective issued on the prediction is waited for through the channel's watch, which
    must honour the caller's own timeout: rank 1 is 2 s late, rank 0's wait(0.5 s) gives up after ~0.5 s."""
    records, _ = _run("predicted_all_reduce_waited_with_a_timeout", tmp_path)
    line = re.search(r"^first wait: (.+) after ([0-9.]+) s; sum right: (\w+)$", records[0], re.M)
    assert line, records[0]
    assert line[1] == "timed out" and 0.4 < float(line[2]) < 1.5 and line[3] == "True", records[0]
    assert "sum right: True" in records[1], records[1]


def test_a_barrier_skipped_by_one_rank_is_a_mismatch_on_both_ranks(tmp_path):
    records, seconds = _run("barrier_skipped_by_one_rank", tmp_path)
    for rank in range(2):
        _mismatch_names(records[rank], [(r"#2 barrier at dist.barrier", _site("barrier")),
                                        (r"#2 all_reduce\(sum\) of \[float32 \(2\)\]", _site("all_reduce after"))])
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_ddp_with_a_parameter_unused_on_one_rank_names_the_rank_and_the_bucket(tmp_path):
    """Rank 1 never sends its bucket and stops at DDP's own check of the next step; rank 0, waiting in
    the bucket's all_reduce, names rank 1 as gone within seconds instead of waiting for the timeout."""
    records, seconds = _run("ddp_parameter_unused_on_one_rank", tmp_path)
    assert records[1].startswith("RuntimeError: Expected to have finished reduction"), records[1]
    assert records[0].startswith("CollectiveFailure: rank 0 of 2: #"), records[0]
    assert re.search(r"all_reduce\(sum\) of \[float32 \(40\)\] at C\+\+ caller in ddp_parameter_unused_on_one_rank",
                     records[0]), records[0]
    assert _site("backward") in records[0] and "rank(s) 1 died" in records[0], records[0]
    assert _seconds(records[0]) < DEAD, records[0]
    assert seconds < FAST


def test_a_rank_that_departs_from_repeated_ddp_steps_is_named_on_both_ranks(tmp_path):
    """Issue #51: after 15 steps the bucket's check passes on the prediction, without an exchange; rank 1's
    extra all_reduce at the 16th departs from it, while rank 0 has already issued its bucket. Both ranks
    name both calls, fast, and say the group is unusable (rank 0's bucket can never complete)."""
    records, seconds = _run("ddp_steps_then_one_rank_logs_its_loss", tmp_path)
    for rank in range(2):
        _mismatch_names(records[rank], [
            (r"all_reduce\(sum\) of \[float32 \(72\)\] at C\+\+ caller in repeated_ddp_steps",
             _site("predicted backward")),
            (r"all_reduce\(sum\) of \[float32 \(\)\] at dist.all_reduce in <lambda>", _site("logged loss"))])
        assert "this group is unusable" in records[rank], records[rank]
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_a_rank_that_stops_after_repeated_ddp_steps_is_named_by_the_others(tmp_path):
    """Issue #51: rank 0's bucket was issued on the prediction, with no exchange to wait at; rank 1 is gone
    before its backward. Rank 0's wait still watches the other ranks and names rank 1."""
    records, seconds = _run("ddp_steps_then_one_rank_stops", tmp_path)
    assert records[0].startswith("CollectiveFailure: rank 0 of 2: #"), records[0]
    assert re.search(r"all_reduce\(sum\) of \[float32 \(72\)\] at C\+\+ caller in repeated_ddp_steps",
                     records[0]), records[0]
    assert _site("predicted backward") in records[0] and "rank(s) 1 died" in records[0], records[0]
    assert _seconds(records[0]) < DEAD, records[0]
    assert seconds < FAST


def test_a_rank_that_stops_is_named_by_the_others(tmp_path):
    records, seconds = _run("rank_one_stops", tmp_path)
    assert records[0].startswith("CollectiveFailure: rank 0 of 2: #2 barrier at dist.barrier"), records[0]
    assert _site("barrier after") in records[0] and "rank(s) 1 died" in records[0], records[0]
    assert _seconds(records[0]) < DEAD, records[0]
    assert seconds < FAST


def test_the_references_preview_forward_then_loss_all_reduce_is_a_mismatch(tmp_path):
    """vector-quantize-pytorch's k-means all-reduces in rank 0's extra training forward; the other rank's
    next collective is its loss all_reduce. Without the wrapper Gloo aborts a rank on the size."""
    pytest.importorskip("vector_quantize_pytorch")
    records, seconds = _run("reference_vq_extra_train_forward_then_loss_allreduce", tmp_path)
    for rank in range(2):
        _mismatch_names(records[rank], [
            (r"all_reduce\(sum\) of \[float32 \(1, 16\)\] at dist.all_reduce in", "vector_quantize_pytorch.py:"),
            (r"all_reduce\(sum\) of \[float32 \(1\)\] at dist.all_reduce in vq_extra", _site("vq loss all_reduce"))])
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_lockstep_vq_preview_forward_then_loss_all_reduce_trains_on(tmp_path):
    """lockstep's VectorQuantize shares the wrapper's channel: rank 0's preview forward and rank 1's first
    forward each run the k-means initialisation's collectives, which agree, so both ranks go on."""
    records, seconds = _run("vq_extra_train_forward_then_loss_allreduce", tmp_path)
    assert records == {0: "ok", 1: "ok"}, records
    assert seconds < FAST


def test_accelerate_gather_on_one_rank_is_a_mismatch_naming_the_gather(tmp_path):
    pytest.importorskip("accelerate")
    records, seconds = _run("accelerate_gather_on_one_rank", tmp_path)
    for rank in range(2):
        _mismatch_names(records[rank], [(r"all_gather.* at dist.all_gather\S* in accelerate_gather", _site("gather")),
                                        (r"all_reduce\(sum\) of \[float32 \(5\)\] at C\+\+ caller",
                                         _site("accelerate backward"))])
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_accelerate_preview_forward_on_the_main_process_is_a_mismatch_naming_the_broadcast(tmp_path):
    # Without the checked backend this layout ends 60 s later in a CollectiveFailure at vq.ema on one rank
    # and Gloo's "connection closed" on the other. With it: DDP's buffer broadcast of rank 0's preview
    # pairs with rank 1's first one; rank 0's next broadcast (its training forward) then meets rank 1's
    # backward, where the quantizer reduces its EMA statistics: named on both ranks in well under a
    # second, rank 0's call at its line, rank 1's at the library's call site and step.
    pytest.importorskip("accelerate")
    records, seconds = _run("accelerate_vq_preview_on_main_process", tmp_path, accelerate=True)
    for rank in range(2):
        _mismatch_names(records[rank], [(r"broadcast\(root 0\) .* at C\+\+ caller", _site("training forward")),
                                        (r"all_reduce\(sum\) of \[float64 .* at vq.ema", "in train step 1")])
        assert _seconds(records[rank]) < QUICK, records[rank]
    assert seconds < FAST


def test_lightning_sync_dist_on_one_rank_is_a_mismatch_naming_the_log_call(tmp_path):
    pytest.importorskip("pytorch_lightning")
    records, seconds = _run("lightning_log_on_one_rank", tmp_path, lightning=True)
    _mismatch_names(records[0], [(r"barrier at dist.barrier in training_step", _site("sync_dist")),
                                 (r"all_reduce\(sum\) of \[float32 \(5\)\] at C\+\+ caller", "checked_scenarios.py:")])
    assert seconds < FAST + 30  # Lightning starts its second process itself


def _train(rank, world, backend_checked):
    import lockstep.distributed
    group = lockstep.distributed.wrap() if backend_checked else None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))
    model.register_buffer("seen", torch.zeros(1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x = torch.randn(4, 8, generator=generator)
        optimizer.zero_grad()
        (ddp(x) - x).square().mean().backward()
        optimizer.step()
        loss = (ddp(x) - x).square().mean().detach().reshape(1)
        dist.all_reduce(loss, group=group)
    return state_with_steps(model), loss


def test_a_clean_ddp_run_is_bitwise_the_same_with_the_wrapper():
    plain = run_ranks(2, _train, False)
    checked = run_ranks(2, _train, True)
    for rank in range(2):
        state, loss = checked[rank]
        assert torch.equal(loss, plain[rank][1])
        for key, value in plain[rank][0].items():
            assert torch.equal(state[key], value), f"rank {rank}: {key} differs with the wrapper"
    assert torch.equal(checked[0][1], checked[1][1])


def _wrapped_group_facts(rank, world):
    import lockstep.distributed
    group = lockstep.distributed.wrap()
    x = torch.full((2,), float(rank + 1))
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    gathered = [torch.empty(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]), group=group)
    y = torch.tensor([float(rank)])
    dist.broadcast(y, src=1, group=group)
    try:  # ops differ only in the reduce op
        dist.all_reduce(torch.ones(1), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.AVG, group=group)
        mismatch = None
    except Exception as e:  # noqa: BLE001
        mismatch = f"{type(e).__name__}: {e}"
    return x.tolist(), [g.item() for g in gathered], y.item(), mismatch, lockstep.distributed.wrap(group) is group


def test_wrap_gives_torchs_results_and_names_the_reduce_op():
    results = run_ranks(2, _wrapped_group_facts)
    for rank, (x, gathered, y, mismatch, idempotent) in enumerate(results):
        assert x == [2.0, 2.0] and gathered == [0.0, 1.0] and y == 1.0 and idempotent
        assert mismatch is not None and mismatch.startswith("CollectiveMismatch"), mismatch
        assert "rank 0: #4 all_reduce(sum) of [float32 (1)]" in mismatch, mismatch
        assert "rank 1: #4 all_reduce(avg) of [float32 (1)]" in mismatch, mismatch


def test_wrap_needs_an_initialized_group():
    import lockstep.distributed
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="not initialized"):
        lockstep.distributed.wrap()


def _uneven_then_destroyed(rank, world):
    import lockstep.distributed
    group = lockstep.distributed.wrap()
    timeout = lockstep.distributed._timeout_of(dist.group.WORLD)
    out = torch.empty(1 + rank)  # reduce_scatter's parts may differ between ranks: not a mismatch
    dist.reduce_scatter(out, [torch.ones(1), torch.ones(2)], group=group)
    gathered = torch.empty(2 * world)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)), group=group)
    dist.destroy_process_group(group)  # the wrapper goes; the group it wrapped keeps working
    x = torch.ones(1)
    dist.all_reduce(x)
    return out.tolist(), gathered.tolist(), x.item(), timeout.total_seconds()


def test_uneven_parts_are_no_mismatch_and_destroying_the_wrapper_leaves_the_group():
    results = run_ranks(2, _uneven_then_destroyed)
    assert results[0] == ([2.0], [0.0, 0.0, 1.0, 1.0], 2.0, 30.0)  # ranks.py makes groups with 30 s
    assert results[1] == ([2.0, 2.0], [0.0, 0.0, 1.0, 1.0], 2.0, 30.0)
