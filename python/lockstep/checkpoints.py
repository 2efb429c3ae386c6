"""Checkpoints of models that hold lockstep modules, as safetensors files. A lockstep module's
state_dict() is the reference's (its keys, shapes and dtypes), with its (seed, step) in the state
dict's metadata, which torch.save keeps and a safetensors file of tensors cannot: save_model and
load_model, safetensors.torch's own, carry them in the file's string metadata too (docs/python/torch.md,
"Where (seed, step) lives")."""
from ._quantizer import LockstepQuantizer

_PREFIX = "lockstep.seed_step:"  # a module's entry in the file's metadata: "lockstep.seed_step:<name>" -> "seed,step"


def state_metadata(model):
    """{key: "seed,step"} of every lockstep module in `model`, under each name the model gives it."""
    return {_PREFIX + name: f"{module.seed},{module.step}"
            for name, module in model.named_modules(remove_duplicate=False) if isinstance(module, LockstepQuantizer)}


def load_state_metadata(model, metadata):
    """Sets the (seed, step) of every lockstep module in `model` that `metadata` (a safetensors file's)
    names; the others keep theirs, as a state dict without them (the reference's) leaves them."""
    for name, module in model.named_modules(remove_duplicate=False):
        value = (metadata or {}).get(_PREFIX + name)
        if isinstance(module, LockstepQuantizer) and value is not None:
            try:
                module.seed, module.step = (int(v) for v in value.split(","))
            except ValueError:
                raise ValueError(f"lockstep: the file's metadata {_PREFIX + name} = {value!r} is not 'seed,step'") \
                    from None


def save_model(model, path, metadata=None):
    """safetensors.torch.save_model(model, path, metadata), with every lockstep module's (seed, step) in the
    file's metadata. The file holds the reference's keys: vector-quantize-pytorch's modules load it as it is."""
    from safetensors.torch import save_model as save  # noqa: PLC0415 (safetensors is the user's, not a dependency)
    save(model, str(path), metadata={**(metadata or {}), **state_metadata(model)})


def load_model(model, path, strict=True, device="cpu"):
    """safetensors.torch.load_model(model, path, strict, device), then every lockstep module's (seed, step)
    from the file's metadata: a resumed module draws on from where it stopped. Returns load_model's
    (missing, unexpected) keys."""
    from safetensors import safe_open  # noqa: PLC0415
    from safetensors.torch import load_model as load  # noqa: PLC0415
    result = load(model, str(path), strict=strict, device=device)
    with safe_open(str(path), "pt") as file:
        load_state_metadata(model, file.metadata())
    return result
