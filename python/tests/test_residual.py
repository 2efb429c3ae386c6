"""lockstep.ResidualVQ against vector_quantize_pytorch.ResidualVQ: identical initial codebooks (the
reference's state dict loads as is), then several training steps."""
import pytest
from vector_quantize_pytorch import ResidualVQ as ReferenceResidualVQ

import lockstep
from reference_steps import compare_training_steps


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False, decay=0.9)])
def test_training_steps_match_the_reference_codebooks_included(options):
    reference = ReferenceResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    ours = lockstep.ResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    compare_training_steps(reference, ours, (2, 50, 12), 3, [f"layers.{q}._codebook.embed" for q in range(3)])


def test_unsupported_options_are_type_errors_naming_them():
    with pytest.raises(TypeError, match="shared_codebook"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, shared_codebook=True)
    with pytest.raises(TypeError, match="learnable_codebook"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, learnable_codebook=True)
    with pytest.raises(TypeError, match="no_such_option"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, no_such_option=1)
