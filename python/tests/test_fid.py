"""lockstep's FID Inception and Frechet distance against pytorch-fid's, on random weights.

pytorch-fid downloads its Inception weights when it builds the network; the test hands it random
ones instead (torchvision's initialisation) and writes the same ones to the safetensors file
lockstep reads, as docs/losses.md tells users to write the real ones."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import lockstep._C as _C

from pytorch_fid import fid_score, inception


@pytest.fixture(scope="module")
def network(tmp_path_factory, monkeypatch_module):
    torch.manual_seed(0)
    donor = inception._inception_v3(num_classes=1008, aux_logits=False, weights=None, init_weights=True)
    for m in donor.modules():  # non-trivial BatchNorm statistics, as trained weights have
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    state = {k: v.detach().clone().contiguous() for k, v in donor.state_dict().items()}
    monkeypatch_module.setattr(inception, "load_state_dict_from_url", lambda *a, **k: state)
    net = inception.InceptionV3([inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
    path = tmp_path_factory.mktemp("fid") / "pt_inception.safetensors"
    save_file(state, str(path))
    return net, str(path)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.parametrize("shape", [(2, 3, 64, 48), (3, 1, 28, 28)])
def test_features_match_pytorch_fid(network, shape):
    net, path = network
    torch.manual_seed(1)
    x = torch.rand(shape) * 2 - 1  # lockstep's images are in [-1, 1], pytorch-fid's in [0, 1]
    rgb = x.expand(-1, 3, -1, -1) if shape[1] == 1 else x
    with torch.no_grad():
        expected = net((rgb + 1) / 2)[0].flatten(1)
    got = _C._fid_features(path, x)
    assert got.shape == (shape[0], 2048)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (got - expected).abs().max()


def test_frechet_distance_matches_pytorch_fid():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((64, 16)), rng.standard_normal((64, 16)) * 1.3 + 0.2
    mu1, s1 = a.mean(0), np.cov(a, rowvar=False)
    mu2, s2 = b.mean(0), np.cov(b, rowvar=False)
    expected = fid_score.calculate_frechet_distance(mu1, s1, mu2, s2)
    got = _C._frechet_distance(*(torch.from_numpy(t) for t in (mu1, s1, mu2, s2)))
    assert got == pytest.approx(expected, rel=1e-6)
    assert _C._frechet_distance(*(torch.from_numpy(t) for t in (mu1, s1, mu1, s1))) == pytest.approx(0, abs=1e-9)
