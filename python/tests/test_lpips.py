"""lockstep's LPIPS-VGG against the lpips package itself, on weights that package makes.

lpips builds its backbone with torchvision's VGG16; with pnet_rand=True and pretrained=False it is
randomly initialised, so nothing is downloaded. The file written is what docs/losses.md tells users
to write."""
import pytest
import torch
from safetensors.torch import save_file

import lockstep._C as _C


@pytest.fixture(scope="module")
def lpips_package():
    import lpips

    return lpips


@pytest.fixture(scope="module")
def network(lpips_package, tmp_path_factory):
    torch.manual_seed(0)
    net = lpips_package.LPIPS(net="vgg", pretrained=False, pnet_rand=True, verbose=False).eval()
    with torch.no_grad():
        for lin in net.lins:  # trained heads are non-negative
            lin.model[-1].weight.uniform_(0, 1)
    path = tmp_path_factory.mktemp("lpips") / "lpips_vgg.safetensors"
    # state_dict() names each head twice (lin0 and lins.0); safetensors wants separate tensors.
    save_file({k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}, str(path))
    return net, str(path)


@pytest.mark.parametrize("shape", [(3, 3, 64, 48), (2, 3, 32, 32), (1, 3, 16, 40)])
def test_distances_match_the_lpips_package(network, shape):
    net, path = network
    torch.manual_seed(1)
    x, y = torch.rand(shape) * 2 - 1, torch.rand(shape) * 2 - 1
    with torch.no_grad():
        expected = net(x, y).flatten()
    got = _C._lpips_distance(path, x, y)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6), (got, expected)
    assert (expected > 0).all()


def test_grey_images_are_compared_as_grey_rgb(network):
    net, path = network
    x, y = torch.rand(2, 1, 32, 32) * 2 - 1, torch.rand(2, 1, 32, 32) * 2 - 1
    with torch.no_grad():
        expected = net(x.expand(-1, 3, -1, -1), y.expand(-1, 3, -1, -1)).flatten()
    assert torch.allclose(_C._lpips_distance(path, x, y), expected, rtol=1e-4, atol=1e-6)


def test_a_file_of_another_layout_is_refused_by_name(network, tmp_path):
    net, _ = network
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    del state["net.slice4.19.weight"]
    path = tmp_path / "short.safetensors"
    save_file(state, str(path))
    with pytest.raises(ValueError, match="no tensor 'net.slice4.19.weight'"):
        _C._lpips_distance(str(path), torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16))
