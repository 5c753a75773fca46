"""A diffusion-style parallel sampler for the recurrent-depth LM (after ``generate_diffusion_style`` of the
official modeling code; Geiping et al., arXiv 2510.14961).

Sequential decoding gives each new token all ``num_steps`` core iterations before the next token starts.
Here a *wavefront* of up to ``wavefront`` positions is in flight at once. Each *sweep* runs ``inner_steps``
core iterations on every position of the wave together, reads a guess for every next token from the coda,
and then

1. writes each guess into the wave as the next position's input token;
2. *freezes* the longest run of leading positions that are done: their state has converged (``freeze``:
   ``latent-diff:t``, relative change over the sweep below ``t``), or they have had ``num_steps``
   iterations (``steps``, and always as a cap), and their input token equals the guess the position before
   them now makes. Frozen positions keep their keys and values in the cache and leave the wave; the guess
   after the last of them is final;
3. extends the wave by one new position, whose input is the last guess, from a fresh initial state.

The wave's positions attend to the frozen positions' cached keys and values and to each other's current
iterates, so a token no longer waits for all the iterations of the one before it: many positions share each
core call. The core keeps one cache slot per layer (``kv_share=1``): a frozen position offers its last
iteration's keys and values to every later iteration.

``state_noise`` mixes fresh initial-state noise into every in-flight state before each sweep, damped by
``1 / (1 + iterations so far)`` (the official ``state_noise_mixing`` with its dampened mixer); 0 turns it off.

At ``wavefront=1``, ``inner_steps=num_steps``, ``freeze="steps"`` and no noise, every token gets exactly the
iterations and cache entries of sequential decoding with ``kv_share=1``, and the output is identical (the
limit at which the official code equals normal generation); tests check it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from latentloop.config import option
from latentloop.errors import UsageError
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.nn.quantized import activation_dtype

if TYPE_CHECKING:
    from latentloop.models.looped import LoopedLM


@dataclass(frozen=True)
class ParallelSampler:
    """The parallel sampler's knobs (see the module docstring)."""

    # The help texts make them options of `latentloop generate` (latentloop.cli.options).
    wavefront: int = option(32, "Parallel sampler: positions in flight at most.")
    inner_steps: int = option(4, "Parallel sampler: core iterations per sweep.")
    freeze: str = option(
        "latent-diff:0.03",
        "Parallel sampler: when a position is final, latent-diff:t (relative change below t) or steps (after "
        "--num-steps iterations, always the cap).",
    )
    state_noise: float = option(
        0.0, "Parallel sampler: noise mixed into in-flight states, damped by 1 / (1 + iterations)."
    )

    def __post_init__(self) -> None:
        for name in ("wavefront", "inner_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(
                    f"parallel sampler: {name} must be a whole number of at least 1, got {value!r}"
                )
        if not 0 <= self.state_noise <= 1:
            raise UsageError(f"parallel sampler: state_noise must be in [0, 1], got {self.state_noise!r}")
        self.threshold()  # an unknown freeze criterion fails here

    def threshold(self) -> float | None:
        """The latent-difference threshold of ``freeze``, or None for ``steps``."""
        name, _, value = self.freeze.partition(":")
        if name == "steps" and not value:
            return None
        if name != "latent-diff":
            raise UsageError(
                f"parallel sampler: freeze must be steps or latent-diff[:t], got {self.freeze!r}"
            )
        try:
            threshold = float(value) if value else 0.03
        except ValueError:
            raise UsageError(f"parallel sampler: latent-diff threshold {value!r} is not a number") from None
        if not threshold > 0:
            raise UsageError(f"parallel sampler: the latent-diff threshold must be positive, got {threshold}")
        return threshold


def parallel_generate(
    model: LoopedLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    depth: int,
    init_scale: float,
    settings: ParallelSampler,
    stop_tokens: list[int] | tuple[int, ...] | None,
    choose: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Continue one prompt ``input_ids`` [1, T0] by up to ``max_new_tokens`` tokens with the parallel sampler.
    ``choose`` picks a token from each row of logits [N, V] (greedy or sampled). Returns the sequence
    [1, T0 + n], the core iterations each new token's position received [1, n], and the number of sweeps."""
    if input_ids.shape[0] != 1:
        raise UsageError("the parallel sampler continues one prompt at a time (batch size 1)")
    config, device = model.config, model.embedding.weight.device
    threshold = settings.threshold()
    stops = set(stop_tokens or [])
    capacity = input_ids.shape[1] + max_new_tokens
    cache = RecurrentKVCache(
        1, config.n_heads, config.head_dim, capacity, 1, activation_dtype(model.embedding), device
    )
    prefill = model(input_ids.to(device), num_steps=depth, init_scale=init_scale, cache=cache)
    produced = [int(choose(prefill.logits[:, -1]))]
    spent = [depth]
    width = config.n_embd
    tokens = torch.tensor([produced], dtype=torch.long, device=device)  # the wave's input tokens [1, n]
    states = model.initialize_state(prefill.latent_states.new_zeros(1, 1, width), init_scale)
    counts = torch.zeros(1, dtype=torch.long, device=device)
    sweeps = 0
    while len(produced) < max_new_tokens and not stops & set(produced):
        n = tokens.shape[1]
        ctx = model.context(n, cache=cache)
        embeds = model.embed(tokens, ctx)
        if settings.state_noise > 0:
            mix = (settings.state_noise / (1 + counts)).to(states.dtype)[None, :, None]
            states = states * (1 - mix) + mix * model.initialize_state(states, init_scale)
        before = states
        for i in range(settings.inner_steps):
            states = model.core_step(states, embeds, ctx, i)
        counts = counts + settings.inner_steps
        sweeps += 1
        guesses = choose(model.predict(states, ctx)[0])  # [n]: the token after each position
        done = counts >= depth
        if threshold is not None:
            change = (states - before)[0].norm(dim=-1) / states[0].norm(dim=-1).clamp_min(1e-12)
            done |= change < threshold
        settled = torch.cat([done.new_ones(1), tokens[0, 1:] == guesses[:-1]])
        ready = (done & settled).long()
        frozen = int(ready.cumprod(0).sum())
        tokens = torch.cat([tokens[:, :1], guesses[None, :-1]], dim=1)
        if frozen:
            cache.advance(frozen)  # the frozen positions' keys and values, from this sweep's last iteration
            produced += guesses[:frozen].tolist()
            spent += counts[:frozen].tolist()
            tokens, states, counts = tokens[:, frozen:], states[:, frozen:], counts[frozen:]
        # Grow the wave while there is room; the last position needed predicts token max_new_tokens.
        last_needed = input_ids.shape[1] + max_new_tokens - 2
        if tokens.shape[1] < settings.wavefront and cache.length + tokens.shape[1] <= last_needed:
            tokens = torch.cat([tokens, guesses[None, -1:]], dim=1)
            fresh = model.initialize_state(states.new_zeros(1, 1, width), init_scale)
            states = torch.cat([states, fresh], dim=1)
            counts = torch.cat([counts, counts.new_zeros(1)])
    produced, spent = produced[:max_new_tokens], spent[:max_new_tokens]
    for index, token in enumerate(produced):
        if token in stops:
            produced, spent = produced[: index + 1], spent[: index + 1]
            break
    new = torch.tensor([produced], dtype=torch.long, device=device)
    return torch.cat([input_ids.to(device), new], dim=1), torch.tensor([spent]), sweeps
