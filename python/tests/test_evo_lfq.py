"""lockstep.EvoLFQ beside vector_quantize_pytorch.EvoLFQ: the same encoder, decoder and LFQ state, the
same torch seed: the same outputs, encodings, decodings and populations generation after generation;
best_gene is the individual that scored best_fitness (a deliberate difference)."""
import copy

import pytest
import torch
from torch import nn

import lockstep

vqp = pytest.importorskip("vector_quantize_pytorch")


def _pair(codebook_size=16, num_codebooks=1, latent=8):
    torch.manual_seed(0)
    encoder, decoder = nn.Linear(5, latent), nn.Linear(latent, 5)
    options = dict(dim=latent, codebook_size=codebook_size, num_codebooks=num_codebooks, pop_size=12,
                   mutation_rate=0.1)
    if num_codebooks > 1:
        options["keep_num_codebooks_dim"] = True
    reference = vqp.EvoLFQ(encoder, decoder, **options)
    ours = lockstep.EvoLFQ(copy.deepcopy(encoder), copy.deepcopy(decoder), **options)
    ours.lfq.load_reference_state_dict(reference.lfq.state_dict())
    return reference, ours


@pytest.mark.parametrize("num_codebooks, latent", [(1, 8), (1, 4), (2, 8)], ids=["projected", "bits", "two_codebooks"])
def test_forward_encode_and_decode_match_the_reference(num_codebooks, latent):
    reference, ours = _pair(num_codebooks=num_codebooks, latent=latent)
    for x in (torch.randn(3, 6, 5), torch.randn(4, 5)):  # tokens, and one latent per item
        expected, got = reference(x), ours(x)
        torch.testing.assert_close(got.reconstructed, expected.reconstructed, atol=1e-5, rtol=1e-5)
        assert torch.equal(got.indices, expected.indices)
        torch.testing.assert_close(got.entropy_aux_loss, expected.entropy_aux_loss, atol=1e-5, rtol=1e-5)
        for signs in (False, True):
            assert torch.equal(ours.encode(x, return_signs=signs), reference.encode(x, return_signs=signs))
    bits = torch.randint(0, 2, (7, 4 * num_codebooks)).float()
    torch.testing.assert_close(ours.decode_bits(bits), reference.decode_bits(bits), atol=1e-5, rtol=1e-5)
    assert ours.training  # decoding put the module back in training mode


def _fitness(target):
    return lambda decoded, bits: -(decoded - target).pow(2).sum(-1)


def test_the_same_seed_evolves_the_same_populations():
    reference, ours = _pair(latent=4)
    fitness = _fitness(torch.linspace(-1, 1, 5))
    results = {}
    for name, module in (("reference", reference), ("ours", ours)):
        torch.manual_seed(3)
        start = module.init_population_from_data(torch.randn(5, 5))
        results[name] = [start] + list(module.evolve(fitness, pop_bits=start, generations=6, tournament_size=3))
    assert torch.equal(results["ours"][0], results["reference"][0])  # encoded, tiled and mutated alike
    for generation, (a, b) in enumerate(zip(results["ours"][1:], results["reference"][1:])):
        assert torch.equal(a.pop_bits, b.pop_bits), generation
        assert a.best_fitness == pytest.approx(b.best_fitness, abs=1e-5), generation


def test_best_gene_is_the_individual_that_scored_the_best_fitness():
    _, ours = _pair(latent=4)
    target = torch.linspace(-1, 1, 5)
    torch.manual_seed(5)
    for result in ours.evolve(_fitness(target), shape=(4,), generations=5, return_best_decoded=True):
        decoded = ours.decode_bits(result.best_gene.unsqueeze(0))
        assert float(_fitness(target)(decoded, None)) == pytest.approx(result.best_fitness, abs=1e-6)
        torch.testing.assert_close(result.best_decoded, decoded.squeeze(0))
    signs = ours.init_random_population(pop_size=6, shape=(4,), is_sign=True)
    assert set(signs.unique().tolist()) <= {-1.0, 1.0}
    mutated = ours.mutate(signs, mutation_rate=1.0, is_sign=True)
    assert torch.equal(mutated, -signs)


def test_bad_arguments_are_errors_naming_them():
    with pytest.raises(ValueError, match="elitism_count"):
        lockstep.EvoLFQ(nn.Identity(), nn.Identity(), dim=4, pop_size=1, elitism_count=1)
    with pytest.raises(ValueError, match="dim or codebook_size"):
        lockstep.EvoLFQ(nn.Identity(), nn.Identity())
    with pytest.raises(TypeError, match="lockstep.LFQ"):
        lockstep.EvoLFQ(nn.Identity(), nn.Identity(), lfq=vqp.LFQ(dim=4))
    evo = lockstep.EvoLFQ(nn.Identity(), nn.Identity(), dim=4)
    with pytest.raises(ValueError, match="shape"):
        next(evo.evolve(lambda d, b: d.sum(-1)))
