"""vector_quantize_pytorch.EvoLFQ: an encoder, a lockstep.LFQ and a decoder, with a genetic search over
the LFQ's bit codes (a population of codes decoded and scored by a fitness function, then selected,
crossed over and mutated). The quantizer is liblockstep's; the search draws from torch's generator,
as the reference, so the same seed gives the same populations."""
from collections import namedtuple

import torch
from torch import nn

from .lfq import LFQ

Return = namedtuple("Return", ["reconstructed", "indices", "entropy_aux_loss"])
Result = namedtuple("Result", ["pop_bits", "best_gene", "best_fitness", "best_decoded"])


def _default(value, fallback):
    return fallback if value is None else value


class _Evaluating:
    """The module in evaluation mode for a block, restored after (the reference's temp_eval)."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.was_training = self.module.training
        self.module.eval()

    def __exit__(self, *exc):
        self.module.train(self.was_training)


class EvoLFQ(nn.Module):
    """EvoLFQ(encoder, decoder, lfq=None, *, dim=None, codebook_size=None, num_codebooks=1, pop_size=64,
    mutation_rate=0.02, tournament_size=2, elitism_count=1, generations=50, **lfq_kwargs) as
    vector-quantize-pytorch's: forward(x) = decoder(LFQ(encoder(x))); evolve(fitness_fn, ...) yields
    each generation's Result."""

    def __init__(self, encoder, decoder, lfq=None, *, dim=None, codebook_size=None, num_codebooks=1, pop_size=64,
                 mutation_rate=0.02, tournament_size=2, elitism_count=1, generations=50, **lfq_kwargs):
        super().__init__()
        if pop_size <= elitism_count:
            raise ValueError(f"lockstep.EvoLFQ: pop_size={pop_size} must be greater than elitism_count={elitism_count}")
        if lfq is None:
            if dim is None and codebook_size is None:
                raise ValueError("lockstep.EvoLFQ: give an lfq, or dim or codebook_size to make one")
            lfq = LFQ(dim=dim, codebook_size=codebook_size, num_codebooks=num_codebooks, **lfq_kwargs)
        elif not isinstance(lfq, LFQ):
            raise TypeError(f"lockstep.EvoLFQ: lfq must be a lockstep.LFQ, not {type(lfq).__name__}")
        self.encoder, self.decoder, self.lfq = encoder, decoder, lfq
        self.pop_size, self.mutation_rate = pop_size, mutation_rate
        self.tournament_size, self.elitism_count, self.generations = tournament_size, elitism_count, generations
        self.register_buffer("zero", torch.tensor(0.0), persistent=False)

    @property
    def device(self):
        return self.zero.device

    def forward(self, x, **kwargs):
        latents = self.encoder(x)
        one_token = latents.ndim == 2
        quantized, indices, aux_loss = self.lfq(latents.unsqueeze(1) if one_token else latents, **kwargs)
        if one_token:
            quantized, indices = quantized.squeeze(1), indices.squeeze(1)
        return Return(self.decoder(quantized), indices, aux_loss)

    @torch.no_grad()
    def encode(self, x, return_signs=False):
        """The signs of the quantized latents, as 0/1 (or -1/+1 with return_signs)."""
        with _Evaluating(self):
            latents = self.encoder(x)
            one_token = latents.ndim == 2
            quantized, _, _ = self.lfq(latents.unsqueeze(1) if one_token else latents)
            if one_token:
                quantized = quantized.squeeze(1)
            if return_signs:
                return torch.where(quantized > 0, 1.0, -1.0)
            return (quantized > 0).float()

    @torch.no_grad()
    def decode_bits(self, bits):
        """Bits (0/1 or -1/+1), (..., codebook_dim * num_codebooks), to indices and through the LFQ's
        codes (liblockstep's decode) and the decoder."""
        with _Evaluating(self):
            bits = (bits > 0).int()
            leading = bits.shape[:-1]
            bits = bits.reshape(-1, bits.shape[-1])
            codebook_dim, num_codebooks = self.lfq.codebook_dim, self.lfq.num_codebooks
            if num_codebooks > 1 and bits.shape[-1] == codebook_dim * num_codebooks:
                bits = bits.reshape(bits.shape[0], num_codebooks, codebook_dim)
            if bits.ndim == 2:
                bits = bits.unsqueeze(1)
            weights = 2 ** torch.arange(codebook_dim - 1, -1, -1, device=bits.device)
            indices = (bits * weights).sum(-1)
            if not self.lfq.keep_num_codebooks_dim and indices.ndim >= 2 and indices.shape[-1] == 1:
                indices = indices.squeeze(-1)
            codes = self.lfq.indices_to_codes(indices)
            if codes.ndim == 3 and codes.shape[1] == 1:
                codes = codes.squeeze(1)
            return self.decoder(codes.reshape(*leading, codes.shape[-1]))

    # The genetic search: torch's generator, as the reference.

    def init_random_population(self, pop_size=None, shape=None, device=None, is_sign=False):
        bits = torch.randint(0, 2, (_default(pop_size, self.pop_size), *shape),
                             device=_default(device, self.device)).float()
        return torch.where(bits > 0, 1.0, -1.0) if is_sign else bits

    def init_population_from_data(self, x, pop_size=None, mutation_rate=None, is_sign=False):
        pop_size, mutation_rate = _default(pop_size, self.pop_size), _default(mutation_rate, self.mutation_rate)
        bits = self.encode(x, return_signs=is_sign)
        if bits.shape[0] < pop_size:
            repeats = -(-pop_size // bits.shape[0])
            bits = bits.repeat(repeats, *([1] * (bits.ndim - 1)))[:pop_size]
        else:
            bits = bits[:pop_size]
        return self.mutate(bits, mutation_rate=mutation_rate, is_sign=is_sign) if mutation_rate > 0 else bits

    def uniform_crossover(self, parent1, parent2):
        return torch.where(torch.rand_like(parent1.float()) < 0.5, parent1, parent2)

    def mutate(self, population, mutation_rate=None, is_sign=False):
        flip = torch.rand_like(population.float()) < _default(mutation_rate, self.mutation_rate)
        return torch.where(flip, -population if is_sign else 1.0 - population, population)

    def tournament_selection(self, population, fitnesses, tournament_size=None):
        contenders = torch.randint(0, population.shape[0], (population.shape[0], _default(tournament_size,
                                                                                              self.tournament_size)),
                                   device=self.device)
        winners = contenders.gather(1, fitnesses[contenders].argmax(dim=-1, keepdim=True))
        return population[winners.squeeze(1)]

    @torch.no_grad()
    def step(self, pop_bits, fitness_fn, tournament_size=None, mutation_rate=None, elitism_count=None, is_sign=False,
             batch_size=None, **kwargs):
        """One generation: (the next population, the fitnesses of `pop_bits`)."""
        tournament_size = _default(tournament_size, self.tournament_size)
        mutation_rate = _default(mutation_rate, self.mutation_rate)
        elitism_count = _default(elitism_count, self.elitism_count)
        pop_size = pop_bits.shape[0]
        offspring_count = pop_size - elitism_count
        if batch_size is not None:
            decoded = torch.cat([self.decode_bits(chunk) for chunk in pop_bits.split(batch_size)])
        else:
            decoded = self.decode_bits(pop_bits)
        fitnesses = fitness_fn(decoded, pop_bits)
        if not torch.is_tensor(fitnesses):
            fitnesses = torch.tensor(fitnesses, device=self.device, dtype=torch.float32)
        elites = pop_bits[torch.argsort(fitnesses, descending=True)[:elitism_count]].clone()
        # two tournaments per child, one child per two parents
        contenders = torch.randint(0, pop_size, (offspring_count, 2, tournament_size), device=self.device)
        winners = fitnesses[contenders].argmax(dim=-1, keepdim=True)
        parents = contenders.gather(-1, winners).squeeze(-1)
        first, second = pop_bits[parents].unbind(1)
        offspring = self.mutate(self.uniform_crossover(first, second), mutation_rate=mutation_rate, is_sign=is_sign)
        return torch.cat([elites, offspring]), fitnesses

    @torch.no_grad()
    def evolve(self, fitness_fn, pop_bits=None, pop_size=None, shape=None, generations=None, is_sign=False,
               return_best_decoded=False, **step_kwargs):
        """Yields each generation's Result. Deliberate difference: best_gene is the individual that
        scored best_fitness (the reference takes the next population's member at that place)."""
        pop_size, generations = _default(pop_size, self.pop_size), _default(generations, self.generations)
        if pop_bits is None:
            if shape is None:
                raise ValueError("lockstep.EvoLFQ: evolve needs pop_bits or shape")
            pop_bits = self.init_random_population(pop_size, shape, is_sign=is_sign)
        best_fitness, best_gene = float("-inf"), None
        for _ in range(generations):
            scored = pop_bits
            pop_bits, fitnesses = self.step(pop_bits, fitness_fn, is_sign=is_sign, **step_kwargs)
            best = torch.argmax(fitnesses)
            if fitnesses[best].item() > best_fitness:
                best_fitness, best_gene = fitnesses[best].item(), scored[best].clone()
            best_decoded = self.decode_bits(best_gene.unsqueeze(0)).squeeze(0) if return_best_decoded else None
            yield Result(pop_bits, best_gene, best_fitness, best_decoded)
