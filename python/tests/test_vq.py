"""lockstep.VectorQuantize against vector_quantize_pytorch.VectorQuantize: identical initial
codebook (the reference's state dict loads as is), then several training steps."""
import pytest
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep
from reference_steps import compare_training_steps


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False), dict(decay=0.9, commitment_weight=0.5)])
def test_training_steps_match_the_reference_codebook_included(options):
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    compare_training_steps(reference, ours, (2, 100, 16), 4, ["_codebook.embed"])


def test_unsupported_options_are_type_errors_naming_them():
    with pytest.raises(TypeError, match="learnable_codebook"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, learnable_codebook=True)
    with pytest.raises(TypeError, match="sync_codebook=False"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, sync_codebook=False)
    with pytest.raises(TypeError, match="affine_param"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, affine_param=True)
