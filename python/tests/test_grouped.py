"""lockstep's grouped residual quantizers and Sequential beside vector-quantize-pytorch's: identical
initial state (the reference's state dict loads group by group), then training steps."""
import pytest
import torch
from vector_quantize_pytorch import GroupedResidualFSQ as ReferenceGroupedResidualFSQ
from vector_quantize_pytorch import GroupedResidualLFQ as ReferenceGroupedResidualLFQ
from vector_quantize_pytorch import GroupedResidualVQ as ReferenceGroupedResidualVQ
from vector_quantize_pytorch import Sequential as ReferenceSequential
from vector_quantize_pytorch import FSQ as ReferenceFSQ

import lockstep
from reference_steps import compare_training_steps

CASES = [
    (ReferenceGroupedResidualVQ, lockstep.GroupedResidualVQ, dict(num_quantizers=3, codebook_size=32),
     ["rvqs.0.layers.0._codebook.embed", "rvqs.1.layers.2._codebook.embed"]),
    (ReferenceGroupedResidualFSQ, lockstep.GroupedResidualFSQ, dict(levels=[8, 5, 5], num_quantizers=2), []),
    (ReferenceGroupedResidualLFQ, lockstep.GroupedResidualLFQ, dict(num_quantizers=2, codebook_size=2**5), []),
]
IDS = ["vq", "fsq", "lfq"]


@pytest.mark.parametrize("reference_class, ours_class, options, state_keys", CASES, ids=IDS)
def test_training_steps_match_the_reference(reference_class, ours_class, options, state_keys):
    torch.manual_seed(0)
    reference = reference_class(dim=16, groups=2, **options)
    ours = ours_class(dim=16, groups=2, **options)
    compare_training_steps(reference, ours, (2, 30, 16), 3, state_keys)


@pytest.mark.parametrize("reference_class, ours_class, options, state_keys", CASES, ids=IDS)
def test_decoding_from_indices_matches_the_reference(reference_class, ours_class, options, state_keys):
    torch.manual_seed(0)
    reference = reference_class(dim=16, groups=2, **options).eval()
    ours = ours_class(dim=16, groups=2, **options).eval()
    ours.load_reference_state_dict(reference.state_dict())
    assert torch.allclose(ours.codebooks, reference.codebooks, atol=1e-6)
    with torch.no_grad():
        quantized, indices, *_ = reference(torch.randn(2, 12, 16))
        assert indices.shape[0] == 2  # groups first
        torch.testing.assert_close(ours.get_codes_from_indices(indices), reference.get_codes_from_indices(indices),
                                   atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.get_output_from_indices(indices), quantized, atol=1e-5, rtol=0)


def test_dim_that_does_not_split_and_a_wrong_input_are_value_errors():
    with pytest.raises(ValueError, match="dim=10 does not split into groups=3"):
        lockstep.GroupedResidualVQ(dim=10, groups=3, num_quantizers=2, codebook_size=8)
    grouped = lockstep.GroupedResidualVQ(dim=8, groups=2, num_quantizers=2, codebook_size=8)
    with pytest.raises(ValueError, match="has 6 values, not dim=8"):
        grouped(torch.randn(1, 4, 6))


def test_groups_draw_from_one_randomness_key_but_start_from_their_own_state():
    grouped = lockstep.GroupedResidualVQ(dim=8, groups=2, num_quantizers=2, codebook_size=8, seed=5,
                                         quantize_dropout=True)
    assert [rvq.seed for rvq in grouped.rvqs] == [5, 5]
    assert not torch.equal(grouped.rvqs[0].codebooks, grouped.rvqs[1].codebooks)
    _, indices, _ = grouped(torch.randn(2, 6, 8))
    dropped = indices == -1
    assert torch.equal(dropped[0], dropped[1])  # the same layers dropped in both groups, as the reference


def test_sequential_matches_the_reference():
    torch.manual_seed(0)
    before, after = torch.nn.Linear(16, 4), torch.nn.Linear(4, 16)
    reference = ReferenceSequential(before, ReferenceFSQ(levels=[8, 5, 5, 5]), after)
    ours = lockstep.Sequential(before, lockstep.FSQ(levels=[8, 5, 5, 5]), after)
    x = torch.randn(2, 10, 16)
    out_ref, idx_ref = reference(x)
    out, idx = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="exactly one lockstep quantizer among its modules, got 0"):
        lockstep.Sequential(before, after)
    with pytest.raises(ValueError, match="got 2"):
        lockstep.Sequential(lockstep.FSQ(levels=[5, 5]), lockstep.FSQ(levels=[5, 5]))


def test_grouped_return_all_codes_and_indices_as_the_reference():
    torch.manual_seed(0)
    options = dict(dim=8, groups=2, num_quantizers=2, codebook_size=16, kmeans_init=False)
    reference, ours = ReferenceGroupedResidualVQ(**options), lockstep.GroupedResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    for module in (reference, ours):
        module.eval()
    x = torch.randn(3, 4, 8)
    expected, got = reference(x, return_all_codes=True), ours(x, return_all_codes=True)
    assert len(got) == len(expected) == 4 and len(got[3]) == 2  # a tuple of each group's codes, as there
    for a, b in zip(got[3], expected[3]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # indices=: one per group; the groups' cross entropies summed
    given = [i.clone() for i in got[1]]
    _, loss = ours(x, indices=given)
    parts = [rvq(chunk, indices=i)[1] for rvq, chunk, i in zip(ours.rvqs, x.chunk(2, dim=-1), given)]
    torch.testing.assert_close(loss, parts[0] + parts[1])
    with pytest.raises(ValueError, match="3 groups"):
        ours(x, indices=given + given[:1])
