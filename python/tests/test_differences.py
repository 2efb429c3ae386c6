"""The deliberate differences from vector-quantize-pytorch that docs/python/ lists, each asserted
beside the reference's behaviour on the same input."""
import pytest
import torch
from vector_quantize_pytorch import FSQ as ReferenceFSQ
from vector_quantize_pytorch import ResidualFSQ as ReferenceResidualFSQ
from vector_quantize_pytorch import ResidualLFQ as ReferenceResidualLFQ
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep


def test_vq_runs_k_means_only_in_training():
    x = torch.randn(2, 40, 8)
    reference = ReferenceVQ(dim=8, codebook_size=16, kmeans_init=True).eval()
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True).eval()
    reference(x)
    ours(x)
    assert bool(reference._codebook.initted)  # the reference initialises in evaluation too
    assert not bool(ours._codebook.initted) and not ours._codebook.embed.any()  # lockstep waits for training
    ours.train()(x)
    assert bool(ours._codebook.initted) and ours._codebook.embed.any()


def test_vq_reports_the_commitment_loss_in_evaluation():
    x = torch.randn(2, 40, 8)
    reference = ReferenceVQ(dim=8, codebook_size=16).eval()
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16).eval()
    ours.load_state_dict(reference.state_dict())
    out_ref, idx_ref, loss_ref = reference(x)
    out, idx, loss = ours(x)
    assert torch.equal(idx, idx_ref) and float(loss_ref) == 0.0
    torch.testing.assert_close(loss, torch.nn.functional.mse_loss(x, out_ref))  # ||x - q||^2, the training value


def test_vq_reports_the_orthogonal_regulariser_in_evaluation():
    """With orthogonal_reg_weight the evaluation loss is the training loss's terms (commitment plus the weighted
    regulariser of the codebook as it is), where the reference's is 0: the seeded sweep's 0.5-1.1 gap."""
    from vector_quantize_pytorch.vector_quantize_pytorch import orthogonal_loss_fn
    x = torch.randn(2, 40, 8)
    reference = ReferenceVQ(dim=8, codebook_size=16, orthogonal_reg_weight=0.7).eval()
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, orthogonal_reg_weight=0.7).eval()
    ours.load_reference_state_dict(reference.state_dict())
    out_ref, idx_ref, loss_ref = reference(x)
    out, idx, loss = ours(x)
    assert torch.equal(idx, idx_ref) and float(loss_ref) == 0.0
    expected = torch.nn.functional.mse_loss(x, out_ref) + 0.7 * orthogonal_loss_fn(reference._codebook.embed.detach())
    torch.testing.assert_close(loss.detach(), expected, atol=1e-6, rtol=1e-5)


def test_random_draws_come_from_seed_and_step():
    x = torch.randn(2, 40, 8)

    def codebook_after_k_means(seed):
        vq = lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True, seed=seed)
        vq(x)
        return vq._codebook.embed.clone()

    torch.manual_seed(1)  # torch's global generator plays no part
    first = codebook_after_k_means(seed=5)
    torch.manual_seed(2)
    assert torch.equal(codebook_after_k_means(seed=5), first)
    assert not torch.equal(codebook_after_k_means(seed=6), first)


def test_residual_quantize_dropout_also_under_no_grad_in_training():
    options = dict(levels=[5, 5], num_quantizers=4, quantize_dropout=True, quantize_dropout_cutoff_index=0)
    reference = ReferenceResidualFSQ(**options)
    x = torch.randn(2, 30, 2)
    with torch.no_grad():
        reference_dropped = [bool((reference(x)[1] == -1).any()) for _ in range(12)]
        # the cutoff comes from (seed, step), and a no_grad forward takes no step: vary the seed
        ours_dropped = [bool((lockstep.ResidualFSQ(**options, seed=seed)(x)[1] == -1).any()) for seed in range(12)]
    assert not any(reference_dropped)  # the reference drops layers only with gradients on
    assert any(ours_dropped)  # lockstep whenever the module trains


def test_fsq_implicit_codebook_is_no_buffer():
    reference, ours = ReferenceFSQ(levels=[5, 4, 3]), lockstep.FSQ(levels=[5, 4, 3])
    assert "implicit_codebook" in dict(reference.named_buffers())  # DDP would broadcast it there
    assert "implicit_codebook" not in dict(ours.named_buffers())
    assert torch.equal(ours.implicit_codebook, reference.implicit_codebook)


def test_spherical_residual_lfq_decodes_the_codes_forward_adds():
    torch.manual_seed(0)
    options = dict(dim=5, codebook_size=32, num_quantizers=3, spherical=True)
    reference = ReferenceResidualLFQ(**options).eval()
    ours = lockstep.ResidualLFQ(**options).eval()
    ours.load_reference_state_dict(reference.state_dict())
    with torch.no_grad():
        quantized, indices, _ = reference(torch.randn(2, 10, 5))
        # The reference decodes with its stored, unnormalised codes: not what its forward added.
        assert (reference.get_output_from_indices(indices) - quantized).abs().max() > 0.1
        torch.testing.assert_close(ours.get_output_from_indices(indices), quantized, atol=1e-5, rtol=0)
        stored = reference.codebooks  # +-2^-q per coordinate
        on_sphere = torch.nn.functional.normalize(stored, dim=-1) * stored.abs().amax(-1, keepdim=True)
        torch.testing.assert_close(ours.codebooks, on_sphere, atol=1e-6, rtol=0)


def test_a_call_s_outputs_and_losses_are_backwarded_together():
    x = torch.randn(2, 6, 8, requires_grad=True)
    reference = ReferenceVQ(dim=8, codebook_size=16)
    out, _, loss = reference(x)
    out.square().mean().backward()
    loss.backward()  # the reference keeps no graph between its outputs and its loss
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16)
    out, _, loss = ours(x)
    before = ours._codebook.embed.clone()
    out.square().mean().backward(retain_graph=True)  # the first reaches the node: the update and the step
    after = ours._codebook.embed.clone()
    assert not torch.equal(after, before) and ours.step == 1
    loss.backward()
    assert torch.equal(ours._codebook.embed, after) and ours.step == 1  # once per call
    out, _, loss = ours(x)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()
