"""lockstep's modules under torch.compile(fullgraph=True): each quantizer is one custom op
(lockstep::quantize, its backward lockstep::quantize_backward), so a model compiles to one graph, and
training and evaluation give what eager gives: outputs, indices, losses, gradients and the state
after several optimizer steps, within 1e-5. On one process with the default backend (inductor), and
on 2 real processes, where a training forward on rank 0 alone still leaves the ranks identical."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import lockstep
from ranks import run_ranks, state_with_steps

STEPS = 3
MODULES = {  # the six, with the options that draw randomness or update state
    "FSQ": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8),
    "VectorQuantize": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9, kmeans_init=True,
                                                      threshold_ema_dead_code=1),
    "LFQ": lambda: lockstep.LFQ(dim=8, codebook_size=2**4, commitment_loss_weight=0.25),
    "ResidualVQ": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, decay=0.9,
                                              quantize_dropout=True),
    "ResidualFSQ": lambda: lockstep.ResidualFSQ(levels=[5, 5, 5], num_quantizers=2, dim=8, quantize_dropout=True),
    "ResidualLFQ": lambda: lockstep.ResidualLFQ(dim=8, codebook_size=2**4, num_quantizers=2,
                                                commitment_loss_weight=0.25),
}
VARIANTS = {  # parameters inside the quantizer, several codebooks, sampling, feature maps
    "VectorQuantize orthogonal": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16,
                                                                 orthogonal_reg_weight=0.5),
    "VectorQuantize orthogonal subset": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16,
                                                                        orthogonal_reg_weight=0.5,
                                                                        orthogonal_reg_active_codes_only=True,
                                                                        orthogonal_reg_max_codes=4),
    "VectorQuantize manual EMA": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, manual_ema_update=True),
    "FSQ rotation": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8, orthogonal_rotation=True),
    "LFQ rotation": lambda: lockstep.LFQ(dim=8, codebook_size=2**4, orthogonal_rotation=True,
                                         cosine_sim_project_in=True),
    "VectorQuantize heads": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, heads=2, codebook_dim=3,
                                                            separate_codebook_per_head=True,
                                                            stochastic_sample_codes=True),
    "LFQ subset": lambda: lockstep.LFQ(dim=8, codebook_size=2**3, num_codebooks=2,
                                                 frac_per_sample_entropy=0.5),
    "FSQ noise dropout": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8, noise_dropout=0.5,
                                                       preserve_symmetry=True),
    # Options issue #38 added: beam search, a shared codebook, implicit codebooks, DiVeQ, a LayerNorm'd
    # projection, LFQ's soft clamp and softplus entropy.
    "ResidualVQ beam": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, beam_size=2),
    "ResidualVQ shared": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, shared_codebook=True),
    "ResidualVQ implicit": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16,
                                                       implicit_neural_codebook=True, mlp_kwargs=dict(depth=1)),
    "ResidualVQ diveq": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, diveq=True),
    "ResidualVQ implicit beam": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16,
                                                            implicit_neural_codebook=True, beam_size=2,
                                                            mlp_kwargs=dict(depth=1)),
    "VectorQuantize bridge": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, vq_bridge=nn.Sequential(
        nn.Linear(8, 8), nn.Tanh())),
    # The codebook diversity loss, computed inside liblockstep's op (it was a graph break in Python).
    "VectorQuantize diversity": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16,
                                                                codebook_diversity_loss_weight=0.3),
    "ResidualVQ shared in-place": lambda: lockstep.ResidualVQ(
        dim=8, num_quantizers=3, codebook_size=16, shared_codebook=True, learnable_codebook=True, ema_update=False,
        in_place_codebook_optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.05)),
    "ResidualVQ bridge": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, vq_bridge=nn.Sequential(
        nn.Linear(8, 8), nn.Tanh())),
    "VectorQuantize bridge kmeans": lambda: lockstep.VectorQuantize(
        dim=8, codebook_size=16, kmeans_init=True, vq_bridge=nn.Sequential(nn.Linear(8, 8), nn.Tanh())),
    "ResidualVQ bridge kmeans": lambda: lockstep.ResidualVQ(
        dim=8, num_quantizers=3, codebook_size=16, kmeans_init=True, vq_bridge=nn.Sequential(nn.Linear(8, 8), nn.Tanh())),
    # The in-place optimizer steps the codebook in backward, after the compiled graph's gradients.
    "VectorQuantize in-place": lambda: lockstep.VectorQuantize(
        dim=8, codebook_size=16, learnable_codebook=True, ema_update=False,
        in_place_codebook_optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.05)),
    "SimVQ transform": lambda: lockstep.SimVQ(dim=8, codebook_size=16, codebook_transform=nn.Sequential(
        nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 8))),
    "VectorQuantize layernorm": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, codebook_dim=4,
                                                                layernorm_after_project_in=True),
    "LFQ soft clamp": lambda: lockstep.LFQ(dim=8, codebook_size=2**4, soft_clamp_input_value=1.5,
                                           experimental_softplus_entropy_loss=True),
    # A straight-through activation on tokens made inside liblockstep: projected, and each residual layer's.
    "LFQ activation projected": lambda: lockstep.LFQ(dim=8, codebook_size=2**3, straight_through_activation=nn.Tanh()),
    "ResidualLFQ activation": lambda: lockstep.ResidualLFQ(dim=8, codebook_size=2**4, num_quantizers=3,
                                                           quantize_dropout=True, straight_through_activation=nn.Tanh()),
}


class Tokenizer(nn.Module):
    """Linear encoder -> quantizer -> linear decoder; forward(x) -> (reconstruction, indices, aux loss)."""

    def __init__(self, quantizer):
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.quantizer = quantizer
        self.decoder = nn.Linear(8, 6)

    def forward(self, x):
        out = self.quantizer(self.encoder(x))
        aux = out[2].sum() if len(out) == 3 else out[0].new_zeros(())
        return self.decoder(out[0]), out[1], aux


def _run(make, data, compiled, backend="inductor", rank=0, world=1):
    """Trains a Tokenizer on `data` (a rank's share of each batch); between steps, a training-mode
    forward under no_grad and an evaluation forward. Everything each step returned, and the state."""
    torch.manual_seed(0)
    model = Tokenizer(make())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    net = torch.compile(model, fullgraph=True, backend=backend) if compiled else model
    seen = []
    for batch in data:
        x = batch.chunk(world)[rank].clone().requires_grad_()
        reconstruction, indices, aux = net(x)
        loss = nn.functional.mse_loss(reconstruction, x.detach()) + aux
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():  # DDP's mean, by hand
            if world > 1 and p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        seen.append([reconstruction.detach(), indices, aux.detach(), x.grad]
                    + [p.grad.clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
        with torch.no_grad():
            seen.append(list(net(batch)))  # training mode, no gradients: a whole step on one process, as eager's
        model.eval()
        with torch.no_grad():
            seen.append(list(net(batch)))
        model.train()
    return seen, state_with_steps(model)


def _assert_same(a, b):
    (seen_a, state_a), (seen_b, state_b) = a, b
    for step, (values_a, values_b) in enumerate(zip(seen_a, seen_b)):
        assert len(values_a) == len(values_b)
        for va, vb in zip(values_a, values_b):
            assert va.dtype == vb.dtype and va.shape == vb.shape, step
            assert torch.allclose(va.float(), vb.float(), atol=1e-5, rtol=1e-5), (step, (va - vb).abs().max())
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.allclose(state_a[key].float(), state_b[key].float(), atol=1e-5), key


def _data():
    return torch.randn(STEPS, 4, 5, 6, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", MODULES)
def test_compiled_module_trains_and_evaluates_as_eager(name):
    torch._dynamo.reset()
    data = _data()
    _assert_same(_run(MODULES[name], data, compiled=False), _run(MODULES[name], data, compiled=True))


@pytest.mark.parametrize("name", VARIANTS)
def test_compiled_variant_trains_and_evaluates_as_eager(name):
    # aot_eager: the graph (the custom ops' shapes and autograd) as inductor gets it, without its codegen.
    torch._dynamo.reset()
    data = _data()
    _assert_same(_run(VARIANTS[name], data, compiled=False),
                 _run(VARIANTS[name], data, compiled=True, backend="aot_eager"))


def test_compiled_module_breaks_no_graph():
    torch._dynamo.reset()
    model = Tokenizer(MODULES["ResidualVQ"]())
    explained = torch._dynamo.explain(model)(torch.randn(4, 5, 6))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    ops = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
    assert [op for op in ops if op.startswith("lockstep.")] == ["lockstep.quantize"], ops


def _train_compiled_on_ranks(rank, world, data):
    result = {}
    for name in ("VectorQuantize", "LFQ", "ResidualFSQ"):
        make = MODULES[name]
        torch.manual_seed(0)
        model = Tokenizer(make())
        net = torch.compile(model, fullgraph=True, backend="aot_eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, batch in enumerate(data):
            if rank == 0 and step == 1:
                net(batch)  # rank 0 alone: a compiled training forward that is never backwarded
            reconstruction, _, aux = net(batch.chunk(world)[rank])
            loss = nn.functional.mse_loss(reconstruction, batch.chunk(world)[rank]) + aux
            optimizer.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            optimizer.step()
        result[name] = state_with_steps(model)
    return result


def test_compiled_modules_on_two_ranks_train_as_one_eager_process():
    data = _data()
    ranks = run_ranks(2, _train_compiled_on_ranks, data)
    for name in ranks[0]:
        torch.manual_seed(0)
        model = Tokenizer(MODULES[name]())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in data:
            reconstruction, _, aux = model(batch)
            loss = nn.functional.mse_loss(reconstruction, batch) + aux
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        for key, value in model.state_dict().items():
            assert torch.equal(ranks[0][name][key], ranks[1][name][key]), (name, key)
            assert torch.allclose(ranks[0][name][key].float(), value.float(), atol=1e-5), (name, key)


def test_custom_op_given_without_its_trailing_defaults_has_gradients():
    # torch 2.11 calls lockstep::quantize's autograd without the arguments left at their defaults
    # (mask, freeze_codebook), also in AOT tracing: its backward must return one entry per argument
    # given. This failed there (the GPU machine's torch, and a torch 2.11 build here); torch 2.15, the
    # test suite's, fills the defaults in itself.
    module = lockstep.VectorQuantize(dim=6, codebook_size=8).train()
    x = torch.randn(2, 5, 6, requires_grad=True)
    parameters = [module.get_parameter(name) for name in module._parameter_names]
    for given in (5, 6, 7):
        x.grad = None
        extra = (None, False)[:given - 5]
        values = torch.ops.lockstep.quantize(x, parameters, module._handle, True, True, *extra)
        values[0].sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape, given


MOVED = {  # a codebook buffer the search reads, with room for codes no token chose
    "VectorQuantize": lambda: lockstep.VectorQuantize(dim=8, codebook_size=64, decay=0.9),
    "VectorQuantize sampled": lambda: lockstep.VectorQuantize(dim=8, codebook_size=64, decay=0.9,
                                                              stochastic_sample_codes=True, sample_codebook_temp=0.1),
    "ResidualVQ": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=64, decay=0.9),
    "ResidualVQ beam": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=64, beam_size=2),
}


def _backward_after_codes_moved(make, compiled):
    """One training call whose first codebook gets, between forward and backward, codes equal to its
    tokens where no token chose a code: a search in backward would choose those."""
    torch.manual_seed(0)
    module = make().train()
    net = torch.compile(module, fullgraph=True, backend="aot_eager") if compiled else module
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
    quantized, indices, loss = net(x)
    name = next(name for name, _ in module.named_buffers() if name.endswith("embed"))
    embed = module.get_buffer(name)
    with torch.no_grad():
        chosen = set((indices if indices.dim() == 2 else indices[..., 0]).reshape(-1).tolist())
        unused = [code for code in range(embed.shape[1]) if code not in chosen][:6]
        embed[0, unused] = x.detach().reshape(6, 8)
    (quantized.square().sum() + loss.sum()).backward()
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return [[quantized.detach(), indices, x.grad]], state


@pytest.mark.parametrize("name", MOVED)
def test_compiled_backward_takes_the_codes_its_forward_chose(name):
    # No second search under compile: backward differentiates and updates with the codes its forward
    # chose (as eager's graph does), whatever happened to the codebook in between (another call's
    # update before this one's backward, as in gradient accumulation).
    torch._dynamo.reset()
    _assert_same(_backward_after_codes_moved(MOVED[name], compiled=False),
                 _backward_after_codes_moved(MOVED[name], compiled=True))


class _CoreCalls:
    """A module seen by the custom ops (lockstep._ops._module) whose liblockstep core records each method the ops
    call on it in `called`."""

    def __init__(self, module, called):
        self._module, self._called = module, called

    def __getattr__(self, name):
        if name != "_core":
            return getattr(self._module, name)
        module, called = self._module, self._called

        class Core:
            def __getattr__(self, method):
                called.append(method)
                return getattr(module._core, method)
        return Core()


def test_compiled_backward_differentiates_the_graph_its_forward_recorded(monkeypatch):
    # The forward runs once under compile: the training forward records the call with its graph, and backward
    # asks liblockstep for nothing but that graph's differentiation (the gradients are eager's:
    # test_compiled_module_trains_and_evaluates_as_eager).
    torch._dynamo.reset()
    called, module_of = [], lockstep._ops._module
    monkeypatch.setattr(lockstep._ops, "_module", lambda handle: _CoreCalls(module_of(handle), called))
    for module in (lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, beam_size=2),
                   lockstep.FSQ(levels=[5, 5, 5], dim=8), lockstep.LFQ(dim=8, codebook_size=16)):
        net = torch.compile(module.train(), fullgraph=True, backend="aot_eager")
        for _ in range(2):
            called.clear()
            out = net(torch.randn(2, 5, 8, requires_grad=True))
            assert called == ["quantize_recorded"], (type(module).__name__, called)
            called.clear()
            (out[0].square().sum() + (out[2].sum() if len(out) > 2 else 0)).backward()
            assert called == ["backward_recorded"], (type(module).__name__, called)


def test_compiled_forward_leaves_no_recorded_call_behind():
    # The call a training forward records lives as long as its graph: backwarded, or never (a forward
    # on some ranks only), nothing is kept once the outputs are gone.
    torch._dynamo.reset()
    module = lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16).train()
    net = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 8, requires_grad=True)
    waiting = lockstep._ops.calls_waiting()
    quantized, _, loss = net(x)
    assert lockstep._ops.calls_waiting() == waiting + 1
    (quantized.sum() + loss.sum()).backward()
    del quantized, loss
    assert lockstep._ops.calls_waiting() == waiting
    net(x)  # never backwarded
    assert lockstep._ops.calls_waiting() == waiting
    with torch.no_grad():
        net(x)
    assert lockstep._ops.calls_waiting() == waiting


def _parameters(module):
    return [module.get_parameter(name) for name in module._parameter_names]


@pytest.mark.parametrize("name", ["VectorQuantize orthogonal", "FSQ noise dropout"])
def test_no_custom_op_writes_its_arguments(name):
    # Each op declares mutates_args=(): torch.compile reorders and reuses an op's arguments on that promise.
    # The state a call changes (the step; here also a codebook parameter, which the orthogonal regulariser
    # makes one, updated by the EMA and dead codes) is the module's, behind the op's handle; torch's schema
    # check fails an op that writes an argument it was given (the step was one, advanced in place).
    torch.manual_seed(0)
    module = VARIANTS[name]().train()
    x = torch.randn(2, 6, 8, requires_grad=True)
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.lockstep.quantize.default, (x, _parameters(module), module._handle, True, True),
                          test_utils=checks)
    for grad_mode in (False, True):  # a whole step on one process; a forward then its backward
        step, state = int(module._steps), {k: v.clone() for k, v in module.state_dict().items()}
        if grad_mode:
            values = torch.ops.lockstep.quantize(x, _parameters(module), module._handle, True, True)
            grads = (torch.ones_like(values[0]), [torch.ones(()) for _ in values[2:-1]])
            torch.library.opcheck(torch.ops.lockstep.quantize_backward.default,
                                  (x.detach(), module._handle, True, *grads, None, False, values[-1]),
                                  test_utils="test_schema")
        else:
            torch.library.opcheck(torch.ops.lockstep.quantize.default, (x.detach(), [], module._handle, True, False),
                                  test_utils="test_schema")
        assert int(module._steps) == step + 1, grad_mode
        changed = [k for k, v in module.state_dict().items() if not torch.equal(v, state[k])]
        assert ("_codebook.embed" in changed) if name.startswith("Vector") else not changed, (grad_mode, changed)


def test_no_initialisation_op_writes_its_arguments():
    # The k-means ops write the codebooks themselves and take copies of them, the slots of their gradients.
    bridge = lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh())  # noqa: E731
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.manual_seed(0)
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True, vq_bridge=bridge()).train()
    torch.library.opcheck(torch.ops.lockstep.vq_initialise.default,
                          (torch.randn(2, 6, 8), vq._codebook.embed.clone(), vq._handle, True, None, True),
                          test_utils=checks)
    assert bool(vq._codebook.initted)
    residual = lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, kmeans_init=True,
                                   vq_bridge=bridge()).train()
    copies = [residual._layer_embed(q).clone() for q in range(2)]
    torch.library.opcheck(torch.ops.lockstep.residual_initialise.default,
                          (torch.randn(2, 6, 8), copies, residual._handle, True), test_utils=checks)
    assert residual._layers_initialised()
