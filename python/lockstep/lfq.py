"""Lookup-free quantization (vector_quantize_pytorch.LFQ's arguments and return values)."""
import math
from collections import namedtuple

import torch
from torch import nn

from ._quantizer import LockstepQuantizer, as_indices, declare_reference_signature, declared_arguments, padding_mask

Return = namedtuple("Return", ["quantized", "indices", "entropy_aux_loss"])
# The reference's second return value with return_loss_breakdown=True: each term unweighted.
LossBreakdown = namedtuple("LossBreakdown", ["per_sample_entropy", "batch_entropy", "commitment"])


def lfq_options(*, dim=None, codebook_size=None, entropy_loss_weight=0.1, commitment_loss_weight=0.0,
                diversity_gamma=1.0, straight_through_activation=nn.Identity(), num_codebooks=1, keep_num_codebooks_dim=None,
                codebook_scale=1.0, frac_per_sample_entropy=1.0, has_projections=None, projection_has_bias=True,
                soft_clamp_input_value=None, cosine_sim_project_in=False, cosine_sim_project_in_scale=None,
                channel_first=None, experimental_softplus_entropy_loss=False, entropy_loss_offset=5.0,
                spherical=False, force_quantization_f32=True, orthogonal_rotation=False, inv_temperature=100.0):
    """vector-quantize-pytorch's LFQ arguments -> (liblockstep's LFQ options (quant/option_specs.h), the
    module's own settings); TypeError naming an option lockstep does not implement."""
    if dim is None and codebook_size is None:
        raise ValueError("lockstep.LFQ: give dim or codebook_size")
    codebook_size = codebook_size if codebook_size is not None else 2**dim
    codebook_dims = (int(codebook_size).bit_length() - 1) * num_codebooks
    dim = dim if dim is not None else codebook_dims
    activation = straight_through_activation
    if activation is None or isinstance(activation, nn.Identity):
        activation = None
    elif not callable(activation):
        raise TypeError(f"lockstep.LFQ: straight_through_activation must be a module, got {type(activation).__name__}")
    if has_projections is False and dim != codebook_dims:  # the reference then fails at its first forward
        raise RuntimeError(f"lockstep.LFQ: has_projections=False needs dim = {codebook_dims} (num_codebooks x "
                           f"log2 codebook_size), got dim={dim}")
    # force_quantization_f32=False: quantized in float32 all the same, as FSQ (docs/python/scalar.md).
    if soft_clamp_input_value is not None and soft_clamp_input_value < codebook_scale:  # the reference's assertion
        raise AssertionError(f"lockstep.LFQ: soft_clamp_input_value={soft_clamp_input_value} must be >= "
                             f"codebook_scale={codebook_scale}, as in the reference")
    if keep_num_codebooks_dim is None:
        keep_num_codebooks_dim = num_codebooks > 1
    if num_codebooks > 1 and not keep_num_codebooks_dim:
        raise ValueError("lockstep.LFQ: keep_num_codebooks_dim must be True with several codebooks")
    # dim, codebook_size, the loss weights, ...: the same names; the rest spelt otherwise there.
    options = declared_arguments("lfq", locals(), besides=("cosine_sim_project_in",))
    options.update(force_projections=bool(has_projections), soft_clamp=float(soft_clamp_input_value or 0.0),
                   softplus_entropy=bool(experimental_softplus_entropy_loss),
                   # The reference's CosineSimLinear projection in, scaled by its scale or codebook_scale.
                   cosine_sim_project_in=float(codebook_scale if cosine_sim_project_in_scale is None
                                               else cosine_sim_project_in_scale) if cosine_sim_project_in else 0.0)
    module = dict(codebook_size=codebook_size, keep_num_codebooks_dim=keep_num_codebooks_dim,
                  channel_first=channel_first, inv_temperature=float(inv_temperature),
                  straight_through_activation=activation)
    return options, module


def bit_mask(codebook_size):
    """What the reference stores as LFQ's `mask` buffer: the bit weights of an index, high bit first."""
    bits = int(codebook_size).bit_length() - 1
    return 2 ** torch.arange(bits - 1, -1, -1)


def in_compute_dtype(t):
    """t in the dtype liblockstep's LFQ computes in: float64 kept, anything else float32."""
    return t.double() if t.dtype == torch.float64 else t.float()


def activation_term(module, change, channel_first):
    """A straight-through activation's change at the code space (..., code dims) as a term of value 0 in forward's
    layout, its gradient the change's: out through the projection's weight, detached (the projection out learns
    from the code alone, as the reference's)."""
    if "project_out" in module._modules:
        change = nn.functional.linear(change, module.project_out.weight.detach())
    change = change - change.detach()
    return change.movedim(-1, 1) if channel_first else change


def call_inv_temperature(module_name, made_with, inv_temperature):
    """forward(inv_temperature=t) -> the binding's per-call argument: none when it is the module's own
    (the compiled path takes that), ValueError unless a finite number > 0 (as the option)."""
    if inv_temperature is None or float(inv_temperature) == made_with:
        return {}
    value = float(inv_temperature)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{module_name}: inv_temperature={inv_temperature} must be a finite number > 0")
    return {"inv_temperature": value}


def lfq_padding_mask(module_name, x, mask, channel_first):
    """forward's mask, as the tokens' (b, n) bool mask (n the tokens of an item, a map's positions
    flattened): the reference takes (b,), the items that count (tokens or maps), and (b, n) for tokens;
    lockstep also (b, ...) for a map's positions. What it leaves out is kept out of the entropy and the
    commitment loss and quantized as any token, as the reference's LFQ does."""
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=x.device)
    if mask.dtype != torch.bool:
        raise ValueError(f"{module_name}: mask must be bool, got {mask.dtype}")
    spatial = x.shape[2:] if channel_first else x.shape[1:-1]
    if mask.shape == x.shape[:1]:  # whole items
        return mask.reshape(-1, 1).expand(x.shape[0], math.prod(spatial))
    if channel_first:
        if mask.shape != (x.shape[0], *spatial):
            raise ValueError(f"{module_name}: a mask of a map is (b,) or (b, ...) = {(x.shape[0], *spatial)}; "
                             f"got {tuple(mask.shape)}")
        return mask.reshape(x.shape[0], -1)
    return padding_mask(module_name, x, mask, None)


class LFQ(LockstepQuantizer):
    """LFQ(dim=None, codebook_size=None, ...) as vector-quantize-pytorch's LFQ: forward(x) takes
    (b, n, dim) tokens or (b, dim, ...) feature maps and returns (quantized, indices, aux_loss).
    Quantization, the entropy and commitment losses and their gradients run in liblockstep."""

    @property
    def _maps_hint(self):
        if self.channel_first is False:
            return ""
        return " or channel-first maps (b, dim, ...)" + ("" if self.channel_first else " of two or more spatial axes")

    def __init__(self, *, seed=None, process_group=None, collective_timeout=300.0, **options):
        options, module = lfq_options(**options)
        super().__init__("lfq", "lfq", options, seed, process_group, collective_timeout)
        self.dim = self._core.dim
        self.codebook_size = module["codebook_size"]
        self.num_codebooks = options["num_codebooks"]
        self.codebook_dim = int(self.codebook_size).bit_length() - 1  # bits per codebook, as the reference's
        self.keep_num_codebooks_dim = module["keep_num_codebooks_dim"]
        self.channel_first = module["channel_first"]
        self.inv_temperature = module["inv_temperature"]
        # A bit's value in code space (liblockstep's too): the scale, over sqrt(bits) on the sphere.
        bits = int(self.codebook_size).bit_length() - 1
        self._code_value = options["codebook_scale"] / (bits**0.5 if options["spherical"] else 1.0)
        if module["straight_through_activation"] is not None:  # `activation.*` in the state dict, as there
            self.activation = module["straight_through_activation"]
        # What liblockstep's Lfq::to_code_space does to a token, for the activation's gradient term alone.
        self._code_space = dict(soft_clamp=options["soft_clamp"], spherical=options["spherical"],
                                scale=options["codebook_scale"], cosine_scale=options["cosine_sim_project_in"])

    def _reference_constants(self):
        return {"mask": bit_mask(self.codebook_size)}

    def indices_to_codes(self, indices, project_out=True):
        """Indices as forward returns them -> the codes, projected out to dim (forward's output) or,
        with project_out=False, in code space (num_codebooks * log2(codebook_size) values of
        +-codebook_scale, on the sphere when spherical); channel first for feature maps."""
        indices = as_indices("lockstep.LFQ", indices)
        keep = int(self.keep_num_codebooks_dim)
        is_map = indices.ndim >= 3 + keep
        channel_first = self.channel_first if self.channel_first is not None else is_map
        flat = indices.reshape(indices.shape[0], -1, *indices.shape[indices.ndim - keep:])
        spatial = indices.shape[1:indices.ndim - keep]
        if project_out:
            codes = self._core.decode(flat.squeeze(-1) if keep and self.num_codebooks == 1 else flat)
        else:
            per_codebook = flat if keep else flat.unsqueeze(-1)  # (b, n, c)
            bits = (per_codebook.unsqueeze(-1) & bit_mask(self.codebook_size).to(flat.device)) != 0
            codes = torch.where(bits, self._code_value, -self._code_value).float()
            if "orthogonal_rot" in self._buffers:  # turned back, as forward's output before its projection
                codes = codes @ self.orthogonal_rot.t()
            codes = codes.flatten(-2)
        codes = codes.reshape(codes.shape[0], *spatial, codes.shape[-1])
        return codes.movedim(-1, 1) if channel_first else codes

    def forward(self, x, inv_temperature=None, return_loss_breakdown=False, mask=None):
        call = call_inv_temperature("lockstep.LFQ", self.inv_temperature, inv_temperature)
        channel_first = self.channel_first if self.channel_first is not None else x.ndim >= 4
        mask = lfq_padding_mask("lockstep.LFQ", x, mask, channel_first)
        out, indices, losses = self._quantize_any(x, channel_first, self.keep_num_codebooks_dim, self.num_codebooks,
                                                  mask, **call)
        if self.training and "activation" in self._modules:
            out = out + self._activation_gradient(x, channel_first).to(out.dtype)
        aux_loss = sum(losses.values()) if losses else torch.zeros((), device=out.device)
        if not return_loss_breakdown:
            return Return(out, indices, aux_loss)
        return Return(out, indices, aux_loss), self._loss_breakdown(x, channel_first, mask, **call)

    def _activation_gradient(self, x, channel_first):
        """straight_through_activation: a term of value 0 whose gradient turns liblockstep's straight-through
        identity at the tokens into the module's, as the reference's act(z) + (q - act(z)).detach(). z, what
        the module sees, is each codebook's bits (..., num_codebooks, bits) after the projection, soft clamp,
        rotation and sphere, made again here in torch (liblockstep makes its own, without the module); the
        term passes back out through the rotation and the projection's weight, detached: the projection out
        learns from the code alone, as there. x in forward's layout."""
        tokens = x.movedim(1, -1) if channel_first else x
        z = self._tokens_in_code_space(tokens)
        change = self.activation(z) - z
        if "orthogonal_rot" in self._buffers:
            change = change @ self.orthogonal_rot.t()
        return activation_term(self, change.flatten(-2), channel_first)

    def _tokens_in_code_space(self, tokens):
        """Lfq::to_code_space in torch operations: (..., dim) -> (..., num_codebooks, bits), differentiable."""
        settings = self._code_space
        z = in_compute_dtype(tokens)
        if "project_in" in self._modules:
            weight = self.project_in.weight
            if settings["cosine_scale"] > 0:  # CosineSimLinear: weight (dim, code dims)
                unit = nn.functional.normalize
                z = (unit(z, dim=-1) @ unit(weight, dim=0).to(z.dtype)) * settings["cosine_scale"]
            else:
                bias = getattr(self.project_in, "bias", None)
                z = nn.functional.linear(z.to(weight.dtype), weight, bias).to(z.dtype)
        if settings["soft_clamp"] > 0:
            z = (z / settings["soft_clamp"]).tanh() * settings["soft_clamp"]
        z = z.reshape(*z.shape[:-1], self.num_codebooks, self.codebook_dim)
        if "orthogonal_rot" in self._buffers:
            z = z @ self.orthogonal_rot.to(z.dtype)
        if settings["spherical"]:
            z = nn.functional.normalize(z, dim=-1) * settings["scale"]
        return z

    def _loss_breakdown(self, x, channel_first, mask, inv_temperature=None):
        """The unweighted terms of this call's loss, of this rank's tokens (liblockstep's Lfq::loss_terms:
        the tokens the call counted). Zeros in evaluation, as the reference's."""
        if torch.compiler.is_compiling():
            raise ValueError("lockstep.LFQ: return_loss_breakdown is not supported under torch.compile; "
                             "call the module eagerly for the breakdown")
        if channel_first:
            x = x.movedim(1, -1).reshape(x.shape[0], -1, x.shape[1])
        group = self._lazy_group() if self.training else None
        # The step the call drew at: a call that was a whole step has advanced it already.
        drawn_at = torch.tensor(self._drawn_at, dtype=torch.int64)
        terms = self._core.loss_terms(x.float(), self.training, self.seed, drawn_at, group, mask, inv_temperature)
        return LossBreakdown(*terms)


declare_reference_signature(LFQ, lfq_options)
