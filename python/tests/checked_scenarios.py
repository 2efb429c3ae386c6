"""Training loops with one rank out of step, under lockstep.distributed (test_checked_collectives.py).

    python -m torch.distributed.run --nproc-per-node 2 checked_scenarios.py SCENARIO OUT
    python checked_scenarios.py lightning_log_on_one_rank OUT  (Lightning launches its own ranks)

Each rank writes OUT/rank<r>.txt: the name of the exception it stopped with and its message, or "ok",
then exits. Lines that issue the collectives end in a `# site:` comment, which the test looks for.
"""
import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import lockstep
import lockstep.distributed  # registers the "lockstep" backend  # noqa: F401

OUT = None


def record(rank, text):
    with open(os.path.join(OUT, f"rank{rank}.txt"), "w") as f:
        f.write(text)


def user_loss_all_reduce_against_broadcast(rank):
    loss = torch.tensor([float(rank)])
    if rank == 0:
        dist.all_reduce(loss)  # site: loss all_reduce
    else:
        dist.broadcast(torch.zeros(3), src=0)  # site: broadcast


def async_all_reduce_returns_before_the_other_rank_arrives(rank):
    """Rank 1 comes 2 s late: rank 0's asynchronous all_reduce must return at once (its check runs on the
    channel's worker), not complete, and give the right sum at wait(). Both forms: the C++ path (a list
    and options, as DDP's buckets) and torch's one-tensor form (the Python path)."""
    figures = []
    for form in ("list", "tensor"):
        t = torch.full((3,), float(rank + 1))
        if rank == 1:
            time.sleep(2.0)
        start = time.monotonic()
        if form == "list":
            work = dist.all_reduce(t, async_op=True)  # site: async all_reduce
        else:
            work = dist.group.WORLD.allreduce(t)
        returned = time.monotonic() - start
        completed = work.is_completed()
        work.wait()
        figures.append(f"{form}: returned after {returned:.3f} s, completed then: {completed}, "
                       f"waited {time.monotonic() - start:.3f} s, sum right: {torch.equal(t, torch.full((3,), 3.0))}")
        dist.barrier()
    return "\n".join(figures)


def predicted_all_reduce_waited_with_a_timeout(rank):
    """Issue #51: 15 equal all_reduces make the 16th's check pass on the prediction, with no exchange; its
    wait watches the other ranks through the channel. Rank 1 comes 2 s late: rank 0's wait(timeout=0.5 s)
    must still give up at its timeout, and a second wait() the sum."""
    for _ in range(15):
        dist.all_reduce(torch.ones(3))
    if rank == 1:
        time.sleep(2.0)
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True)
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=0.5))
        first = "completed"
    except RuntimeError:
        first = "timed out"
    waited = time.monotonic() - start
    work.wait()
    return f"first wait: {first} after {waited:.3f} s; sum right: {torch.equal(t, torch.full((3,), 2.0))}"


def barrier_skipped_by_one_rank(rank):
    if rank == 0:
        dist.barrier()  # site: barrier
    dist.all_reduce(torch.ones(2))  # site: all_reduce after


def ddp_parameter_unused_on_one_rank(rank):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)})

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = model

        def forward(self, x, use_b):
            y = self.layers["a"](x)
            return self.layers["b"](y) if use_b else y

    ddp = torch.nn.parallel.DistributedDataParallel(Net())
    for _ in range(2):
        ddp(torch.ones(2, 4), use_b=rank == 0).sum().backward()  # site: backward


def repeated_ddp_steps(rank, before_rank_ones_last_backward):
    """Issue #51's predicted checks: 15 DDP steps repeat one bucket's all_reduce, which the ranks then check
    on the prediction, with no exchange; at the 16th, rank 1 does something else first. Rank 0 has issued
    the bucket by then and waits for it."""
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    x = torch.ones(4, 8)
    for step in range(16):
        loss = ddp(x).square().mean()
        if step == 15 and rank == 1:
            before_rank_ones_last_backward(loss)
        loss.backward()  # site: predicted backward


def ddp_steps_then_one_rank_logs_its_loss(rank):
    """Rank 1 all-reduces its loss before its 16th backward (a logging call): both must name both calls."""
    repeated_ddp_steps(rank, lambda loss: dist.all_reduce(loss.detach()))  # site: logged loss


def ddp_steps_then_one_rank_stops(rank):
    """Rank 1 is gone before its 16th backward, as a killed process: rank 0 must still name it."""
    repeated_ddp_steps(rank, lambda loss: os._exit(0))


def vq_extra_train_forward_then_loss_allreduce(rank, reference=False):
    """The reference's scenario: rank 0 alone runs a training-mode forward (a preview) before the first
    step, whose k-means initialisation communicates; then every rank all-reduces its loss."""
    torch.manual_seed(0)
    if reference:
        from vector_quantize_pytorch import VectorQuantize
        vq = VectorQuantize(dim=8, codebook_size=16, kmeans_init=True, sync_kmeans=True)
    else:
        vq = lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True)
    x = torch.randn(2, 32, 8)
    if rank == 0:
        vq(x)  # site: preview forward
    out, _, loss = vq(x)
    total = (out.square().mean() + loss.sum()).detach().reshape(1)
    dist.all_reduce(total)  # site: vq loss all_reduce


def reference_vq_extra_train_forward_then_loss_allreduce(rank):
    vq_extra_train_forward_then_loss_allreduce(rank, reference=True)


def rank_one_stops(rank):
    if rank == 1:
        os._exit(0)  # gone without a word, as a killed process
    dist.barrier()  # site: barrier after


def accelerate_gather_on_one_rank(rank):
    """accelerate on the CPU insists on Gloo by name, so the group is made first (accelerate adopts an
    initialised one); rank 0 gathers its loss for a log, rank 1 has gone on to its backward."""
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    loss = model(torch.ones(2, 4)).square().mean()
    if rank == 0:
        accelerator.gather(loss.detach())  # site: gather
    accelerator.backward(loss)  # site: accelerate backward


class _Tokenizer(torch.nn.Module):
    """Linear encoder -> lockstep's VectorQuantize -> linear decoder; forward(x) -> (reconstruction, aux loss)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.quantizer = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9)
        self.decoder = torch.nn.Linear(8, 4)

    def forward(self, x):
        quantized, _, aux = self.quantizer(self.encoder(x))
        return self.decoder(quantized), aux


def accelerate_vq_preview_on_main_process(rank):
    """Issue #37's layout under `accelerate launch`: the checked backend made before Accelerator (which
    adopts it), a tokenizer with lockstep's VectorQuantize prepared by accelerate (DDP, which broadcasts
    the buffers at every forward), and the main process alone running a training-mode forward through
    the prepared model (a preview for a log). Its buffer broadcast meets rank 1's backward."""
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(_Tokenizer())
    x = torch.randn(2, 5, 4)
    if accelerator.is_main_process:
        model(x)  # site: preview forward
    for _ in range(2):
        reconstruction, aux = model(x)  # site: training forward
        accelerator.backward((reconstruction - x).square().mean() + aux)  # site: training backward


def lightning_log_on_one_rank(out):
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            loss = self.layer(batch).square().mean()
            if self.global_rank == 0:
                self.log("loss", loss, sync_dist=True)  # site: sync_dist
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Record(pl.Callback):
        def on_exception(self, trainer, module, exception):
            record(trainer.global_rank, f"{type(exception).__name__}: {exception}")

    data = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="lockstep"),
                         max_epochs=1, callbacks=[Record()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), data)
    record(trainer.global_rank, "ok")


def main():
    global OUT
    scenario, OUT = sys.argv[1], sys.argv[2]
    if scenario == "lightning_log_on_one_rank":
        return lightning_log_on_one_rank(OUT)
    dist.init_process_group("lockstep")  # under `accelerate launch` too: made before Accelerator, which adopts it
    rank = dist.get_rank()
    dist.barrier()  # both ranks start the scenario together: the time to the error is the check's
    start = time.monotonic()
    try:
        record(rank, globals()[scenario](rank) or "ok")
    except Exception as e:  # noqa: BLE001 (the record is the test's evidence)
        seconds = time.monotonic() - start
        record(rank, f"{type(e).__name__}: {e}\nafter {seconds:.3f} s\n{traceback.format_exc()}")
    # No destroy_process_group: after a failed collective it may wait for ranks that have gone.
    os._exit(0)


if __name__ == "__main__":
    main()
