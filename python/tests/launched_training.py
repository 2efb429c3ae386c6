"""A training run as users launch one: `python launched_training.py FRAMEWORK OUT` under torchrun or
`accelerate launch` (2 processes, CPU, Gloo), or on its own for Lightning (its DDP strategy starts the
second process itself). For each of FSQ, VectorQuantize and LFQ, a small tokenizer trains 3 epochs in
DDP while rank 0 alone runs the model in training mode at every epoch end (the "log a preview"
pattern); every rank then saves its state to OUT/<module>-rank<r>.pt for the test to compare."""
import os
import sys

import torch
from torch import nn

import lockstep

QUANTIZERS = {
    "FSQ": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8, collective_timeout=20.0),
    "VectorQuantize": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, collective_timeout=20.0),
    "LFQ": lambda: lockstep.LFQ(dim=8, codebook_size=2**4, collective_timeout=20.0),
}
EPOCHS, ITEMS, BATCH = 3, 32, 4


class Tokenizer(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.quantizer = QUANTIZERS[name]()
        self.decoder = nn.Linear(8, 6)

    def forward(self, x):
        out = self.quantizer(self.encoder(x))
        aux = out[2].sum() if len(out) == 3 else out[0].new_zeros(())
        return self.decoder(out[0]), aux


def loss_of(model, x):
    reconstruction, aux = model(x)
    return nn.functional.mse_loss(reconstruction, x) + aux


def preview(module):
    """What a rank-0 logging callback runs: the model in training mode, with gradients, never backwarded."""
    module.train()
    reconstruction, _ = module(torch.randn(2, 5, 6))
    return float(reconstruction.detach().abs().mean())


def data():
    return torch.utils.data.TensorDataset(torch.randn(ITEMS, 5, 6, generator=torch.Generator().manual_seed(1)))


def save(module, out, name, rank):
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, os.path.join(out, f"{name}-rank{rank}.pt"))


def with_torchrun(out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in QUANTIZERS:
        torch.manual_seed(0)
        net = Tokenizer(name)
        ddp = DistributedDataParallel(net)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        sampler = torch.utils.data.DistributedSampler(data(), shuffle=False)
        for epoch in range(EPOCHS):
            for (x,) in torch.utils.data.DataLoader(data(), batch_size=BATCH, sampler=sampler):
                optimizer.zero_grad()
                loss_of(ddp, x).backward()
                optimizer.step()
            if rank == 0:
                preview(net)
        save(net, out, name, rank)
        del net, ddp, optimizer  # the modules' checked groups end before the process group does
    dist.destroy_process_group()


def with_accelerate(out):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    for name in QUANTIZERS:
        torch.manual_seed(0)
        net = Tokenizer(name)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(data(), batch_size=BATCH)
        model, optimizer, loader = accelerator.prepare(net, optimizer, loader)
        for epoch in range(EPOCHS):
            for (x,) in loader:
                optimizer.zero_grad()
                accelerator.backward(loss_of(model, x))
                optimizer.step()
            if accelerator.is_main_process:
                preview(accelerator.unwrap_model(model))
        save(accelerator.unwrap_model(model), out, name, accelerator.process_index)


def with_lightning(out):
    import pytorch_lightning as pl
    from pytorch_lightning.utilities import rank_zero_only

    class Module(pl.LightningModule):
        def __init__(self, name):
            super().__init__()
            self.net = Tokenizer(name)

        def training_step(self, batch, index):
            return loss_of(self.net, batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Preview(pl.Callback):
        @rank_zero_only
        def on_train_epoch_end(self, trainer, module):
            preview(module.net)

    for name in QUANTIZERS:
        torch.manual_seed(0)
        module = Module(name)
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, callbacks=[Preview()],
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(module, torch.utils.data.DataLoader(data(), batch_size=BATCH))
        save(module.net, out, name, trainer.global_rank)


if __name__ == "__main__":
    framework, out = sys.argv[1], sys.argv[2]
    {"torchrun": with_torchrun, "accelerate": with_accelerate, "lightning": with_lightning}[framework](out)
