"""Generation for the recurrent-depth LM: any depth, KV cache (optionally shared across iterations),
per-token adaptive exit, continuous chain of thought, self-speculative decoding, left-padded batches, and
width in latent space (K trajectories per prompt from random initial states, answer by majority vote).

The prompt is prefilled at full depth in one pass. Each new token then runs the prelude once, the core one
iteration at a time (so a token can stop early), and the coda once.

With ``compile=True`` those three pieces of a new token run as ``torch.compile`` graphs. At batch 1 on a CPU,
eager decoding spends about half its time dispatching small kernels (norms, rotations, residuals) around the
matrix-vector products; a compiled graph fuses them. The graphs see only fixed shapes (the cache is sized for the whole call,
to a power of two, and attention masks what is not yet written; see
:class:`~latentloop.models.kv_cache.DecodeSlots`), so one compilation serves every token, iteration and cache
slot of every later call of that size.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from latentloop.errors import UsageError
from latentloop.models.kv_cache import DecodeSlots, RecurrentKVCache
from latentloop.models.parallel_sampler import ParallelSampler, parallel_generate

if TYPE_CHECKING:  # annotations only: recurrent_depth imports this module for RecurrentDepthLM.generate
    from latentloop.models.recurrent_depth import RecurrentDepthLM, StepContext

# Exit criteria: name -> (default threshold, needs the coda's logits).
EXIT_CRITERIA = {
    "kl": (5e-4, True),
    "entropy-diff": (1e-3, True),
    "latent-diff": (0.03, False),
    "argmax-stability": (5, True),
    "cosine": (1e-3, False),
}


class ExitCriterion:
    """Decides, after each core iteration, which rows have converged.

    ``kl``: KL(p_i || p_{i-1}) of successive next-token distributions < threshold; ``entropy-diff``:
    |H_i - H_{i-1}| < threshold; ``latent-diff``: ||s_i - s_{i-1}|| / ||s_i|| < threshold; ``cosine``:
    1 - cos(s_i, s_{i-1}) < threshold; ``argmax-stability``: the argmax has not changed for ``threshold`` steps.
    """

    def __init__(self, name: str, threshold: float | None = None) -> None:
        if name not in EXIT_CRITERIA:
            raise UsageError(f"unknown exit criterion {name!r} (known: {', '.join(EXIT_CRITERIA)})")
        default, self.needs_logits = EXIT_CRITERIA[name]
        self.name = name
        self.threshold = float(default if threshold is None else threshold)
        if self.threshold < 0:
            raise UsageError(f"exit threshold must not be negative, got {self.threshold}")
        if name == "argmax-stability" and (self.threshold < 1 or not self.threshold.is_integer()):
            raise UsageError(f"argmax-stability needs a whole number of steps >= 1, got {self.threshold}")
        self.reset()

    @classmethod
    def parse(cls, spec: str | ExitCriterion | None) -> ExitCriterion | None:
        """``"kl:5e-4"`` or ``"cosine"`` (default threshold) -> criterion; ``None``/``"none"`` -> no exit."""
        if spec is None or isinstance(spec, ExitCriterion):
            return spec
        name, _, value = str(spec).partition(":")
        if name == "none":
            return None
        if not value:
            return cls(name)
        try:
            threshold = float(value)
        except ValueError:
            raise UsageError(f"exit threshold {value!r} is not a number") from None
        return cls(name, threshold)

    def reset(self) -> None:
        self.previous: torch.Tensor | None = None
        self.stable = None

    def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        """Rows ([B] bool) that meet the criterion after this iteration (last position only)."""
        if self.name in ("latent-diff", "cosine"):
            current = state[:, -1].float()
        elif self.name == "argmax-stability":
            current = logits[:, -1].argmax(-1)
        else:
            current = F.log_softmax(logits[:, -1].float(), dim=-1)
        previous, self.previous = self.previous, current
        if previous is None:
            if self.name == "argmax-stability":
                self.stable = torch.zeros_like(current)
            return torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
        if self.name == "kl":
            value = (current.exp() * (current - previous)).sum(-1)
        elif self.name == "entropy-diff":
            value = ((current.exp() * current).sum(-1) - (previous.exp() * previous).sum(-1)).abs()
        elif self.name == "latent-diff":
            value = (current - previous).norm(dim=-1) / current.norm(dim=-1).clamp_min(1e-12)
        elif self.name == "cosine":
            value = 1 - F.cosine_similarity(current, previous, dim=-1)
        else:
            self.stable = torch.where(current == previous, self.stable + 1, torch.zeros_like(self.stable))
            return self.stable >= self.threshold
        return value < self.threshold


@dataclass
class GenerationOutput:
    """``sequences`` [B, T0 + n]; ``steps`` [B, n] core iterations spent on each new token;
    ``trajectories`` (on request) one tensor [iterations, B, h] per new token: the state after each iteration.
    With ``num_samples=K > 1``: ``sequences`` holds each prompt's voted continuation, ``samples`` [B, K, T0 + n]
    every trajectory's and ``votes`` [B] how many trajectories gave the chosen one. ``logits`` (on request)
    [B, n, V]: the fp32 logits each new token was chosen from."""

    sequences: torch.Tensor
    steps: torch.Tensor
    seconds: float
    trajectories: list[torch.Tensor] = field(default_factory=list)
    samples: torch.Tensor | None = None
    votes: torch.Tensor | None = None
    sweeps: int | None = None  # the parallel sampler's wave sweeps
    logits: torch.Tensor | None = None

    @property
    def new_tokens(self) -> int:
        return self.steps.shape[1]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens * self.sequences.shape[0] / max(self.seconds, 1e-9)

    @property
    def mean_steps(self) -> float:
        return float(self.steps.float().mean()) if self.steps.numel() else 0.0


def select_token(
    logits: torch.Tensor,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Greedy argmax, or a sample after temperature, top-k and top-p (nucleus) filtering. ``logits`` [B, V]."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / max(temperature, 1e-6)
    if top_k is not None and top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop tokens once the mass before them already reaches top_p (the first token always stays).
        drop = (cumulative - sorted_logits.softmax(-1)) >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def generate(
    model: RecurrentDepthLM,
    input_ids: torch.Tensor,
    max_new_tokens: int = 32,
    num_steps: int | None = None,
    init_scale: float = 1.0,
    attention_mask: torch.Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: list[int] | tuple[int, ...] | None = None,
    pad_token_id: int = 0,
    kv_share: int | None = None,
    exit: str | ExitCriterion | None = None,
    continuous: bool = False,
    speculative: int | None = None,
    draft_tokens: int = 4,
    return_trajectory: bool = False,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    num_samples: int = 1,
    sampler: str | ParallelSampler = "sequential",
    compile: bool = False,
    return_logits: bool = False,
) -> GenerationOutput:
    """Continue ``input_ids`` [B, T0] by up to ``max_new_tokens`` tokens at depth ``num_steps``.

    ``attention_mask`` (1 = token, 0 = left padding) makes padded batches exact. ``kv_share=k`` keeps k core
    cache slots (iteration i uses slot i mod k). ``exit`` (e.g. ``"kl:5e-4"``) stops each token's iterations
    once the criterion holds. ``continuous`` starts each token from the previous token's final state.
    ``speculative=d`` drafts ``draft_tokens`` tokens at depth d and verifies them in one full-depth pass.
    ``use_cache=False`` recomputes the whole sequence for every token (a reference for testing).
    ``num_samples=K`` runs K latent trajectories of every prompt as one batch, each from its own random
    initial state (``init_scale > 0``), and returns the continuation most of them agree on (ties go to the
    earliest trajectory); see :func:`vote_continuations`.
    ``sampler="parallel"`` (or a :class:`~latentloop.models.parallel_sampler.ParallelSampler` with its knobs)
    decodes a wavefront of positions at once instead of one token after another.
    ``compile=True`` runs each new token's prelude, core iterations and coda as compiled graphs (see the
    module docstring); the first call of a size pays the compilation. ``return_logits`` keeps the logits of
    every chosen token (sequential decoding).
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise UsageError("the prompt is empty: give at least one token")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise UsageError(f"num_samples must be a whole number of at least 1, got {num_samples!r}")
    if num_samples > 1:
        if init_scale <= 0:
            raise UsageError(
                "num_samples > 1 needs init_scale > 0: trajectories from the zero state are all the same"
            )
        if speculative is not None or _parse_sampler(sampler) is not None or return_logits:
            raise UsageError(
                "speculative decoding, the parallel sampler and return_logits take num_samples=1"
            )
        wide = generate(
            model,
            input_ids.repeat_interleave(num_samples, dim=0),
            max_new_tokens=max_new_tokens,
            num_steps=num_steps,
            init_scale=init_scale,
            attention_mask=None
            if attention_mask is None
            else attention_mask.repeat_interleave(num_samples, 0),
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop_tokens=stop_tokens,
            pad_token_id=pad_token_id,
            kv_share=kv_share,
            exit=exit,
            continuous=continuous,
            return_trajectory=return_trajectory,
            use_cache=use_cache,
            generator=generator,
            compile=compile,
        )
        samples = wide.sequences.view(input_ids.shape[0], num_samples, -1)
        chosen, votes = vote_continuations(samples[:, :, input_ids.shape[1] :])
        rows = torch.arange(input_ids.shape[0], device=samples.device)
        wide.sequences = samples[rows, chosen]
        wide.steps = wide.steps.view(input_ids.shape[0], num_samples, -1)[rows.cpu(), chosen.cpu()]
        wide.samples, wide.votes = samples, votes
        return wide
    if max_new_tokens < 0:
        raise UsageError(f"max_new_tokens must not be negative, got {max_new_tokens}")
    depth = int(num_steps if num_steps is not None else model.config.mean_recurrence)
    if depth < 1:
        raise UsageError(f"num_steps must be at least 1, got {depth}")
    criterion = ExitCriterion.parse(exit)
    parallel = _parse_sampler(sampler)
    if parallel is not None:
        changed = [
            name
            for name, value, default in (
                ("exit", criterion, None),
                ("continuous", continuous, False),
                ("speculative", speculative, None),
                ("kv_share", kv_share, None),
                ("return_trajectory", return_trajectory, False),
                ("use_cache", use_cache, True),
                ("attention_mask", attention_mask, None),
                ("compile", compile, False),
                ("return_logits", return_logits, False),
            )
            if value is not default
        ]
        if changed:
            raise UsageError(f"the parallel sampler does not combine with {', '.join(changed)}")
    if speculative is not None and (criterion is not None or continuous or not use_cache):
        raise UsageError(
            "speculative decoding cannot be combined with adaptive exit, continuous mode or no cache"
        )
    if speculative is not None and not 1 <= speculative <= depth:
        raise UsageError(
            f"speculative draft depth must be between 1 and num_steps ({depth}), got {speculative}"
        )
    if speculative is not None and input_ids.shape[0] != 1:
        raise UsageError("speculative decoding runs one sequence at a time (batch size 1)")
    if not use_cache and (criterion is not None or continuous or kv_share is not None or compile):
        raise UsageError("adaptive exit, continuous mode, kv_share and compile need the KV cache")
    if speculative is not None and (compile or return_logits):
        raise UsageError("speculative decoding does not combine with compile or return_logits")
    total = input_ids.shape[1] + max_new_tokens + (draft_tokens + 1 if speculative else 0)
    if total > model.config.block_size:
        raise UsageError(f"prompt plus new tokens ({total}) exceed block_size {model.config.block_size}")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            decoder = _Decoder(
                model, input_ids, depth, init_scale, attention_mask, kv_share, total, use_cache, compile
            )
            sampling = dict(
                do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )
            started = time.perf_counter()
            if parallel is not None:
                sequences, steps, sweeps = parallel_generate(
                    model,
                    input_ids,
                    max_new_tokens,
                    depth,
                    init_scale,
                    parallel,
                    stop_tokens,
                    lambda logits: select_token(logits, **sampling),
                )
                out = GenerationOutput(sequences, steps, 0.0, sweeps=sweeps)
            elif speculative is not None:
                out = decoder.speculative(max_new_tokens, speculative, draft_tokens, stop_tokens, sampling)
            else:
                out = decoder.run(
                    max_new_tokens,
                    criterion,
                    continuous,
                    stop_tokens,
                    pad_token_id,
                    sampling,
                    return_trajectory,
                    return_logits,
                )
            out.seconds = time.perf_counter() - started
    finally:
        model.train(was_training)
    return _plain(out)


def _parse_sampler(sampler: str | ParallelSampler) -> ParallelSampler | None:
    """None for sequential decoding, else the parallel sampler's settings."""
    if isinstance(sampler, ParallelSampler):
        return sampler
    if sampler == "sequential":
        return None
    if sampler == "parallel":
        return ParallelSampler()
    raise UsageError(f"unknown sampler {sampler!r} (sequential or parallel)")


def vote_continuations(continuations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Majority vote over K continuations of each prompt, ``continuations`` [B, K, n] token ids (rows that
    stopped early are padded alike, so equal answers are equal rows). Returns the index [B] of the chosen
    trajectory, the earliest among those with the most common continuation, and its count [B]."""
    batch, k, _ = continuations.shape
    same = (continuations[:, :, None, :] == continuations[:, None, :, :]).all(-1)  # [B, K, K]
    counts = same.sum(-1)  # trajectories that agree with each one, itself included
    best = counts.max(-1, keepdim=True).values
    # The earliest trajectory among the most common: argmax of a score that prefers higher count, then lower index.
    order = torch.arange(k, 0, -1, device=continuations.device).expand(batch, k)
    chosen = torch.where(counts == best, order, torch.zeros_like(order)).argmax(-1)
    return chosen, best.squeeze(-1)


def _plain(out: GenerationOutput) -> GenerationOutput:
    """Copies of inference-mode tensors, so callers may use them with autograd afterwards."""
    with torch.inference_mode(False):
        out.sequences = out.sequences.clone()
        out.steps = out.steps.clone()
        out.trajectories = [t.clone() for t in out.trajectories]
        if out.logits is not None:
            out.logits = out.logits.clone()
    return out


class _Decoder:
    """Holds the sequence, its mask and the KV cache during one ``generate`` call."""

    def __init__(
        self,
        model: RecurrentDepthLM,
        input_ids: torch.Tensor,
        depth: int,
        init_scale: float,
        attention_mask: torch.Tensor | None,
        kv_share: int | None,
        capacity: int,
        use_cache: bool,
        compiled: bool = False,
    ) -> None:
        config = model.config
        self.model, self.depth, self.init_scale = model, depth, init_scale
        self.device = model.transformer.wte.weight.device
        self.sequences = input_ids.to(self.device)
        self.mask = None if attention_mask is None else attention_mask.to(self.device).long()
        if self.mask is not None and self.mask.shape != input_ids.shape:
            raise UsageError(
                f"attention_mask shape {tuple(self.mask.shape)} differs from input {tuple(input_ids.shape)}"
            )
        self.cache = None
        self.compiled = _compiled_steps() if compiled else None
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)  # where a compiled step writes
        self.slot_buffers: dict[int, DecodeSlots] = {}
        self.views: dict[int, StepContext] = {}  # this token's contexts, by slot
        if compiled:
            # Few distinct sizes, so few compilations; attention over the unwritten tail is masked.
            capacity = min(config.block_size, max(64, 1 << (capacity - 1).bit_length()))
        if use_cache:
            dtype = model.transformer.wte.weight.dtype
            self.cache = RecurrentKVCache(
                input_ids.shape[0], config.n_heads, config.head_dim, capacity, kv_share, dtype, self.device
            )

    def _full_forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            self.sequences,
            num_steps=self.depth,
            init_scale=self.init_scale,
            attention_mask=self.mask,
            cache=self.cache,
        )
        return out.logits[:, -1], out.latent_states[:, -1:]

    def _append(self, tokens: torch.Tensor) -> None:
        self.sequences = torch.cat([self.sequences, tokens[:, None]], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, torch.ones_like(tokens)[:, None]], dim=1)

    def run(
        self,
        max_new_tokens,
        criterion,
        continuous,
        stop_tokens,
        pad_token_id,
        sampling,
        return_trajectory,
        return_logits=False,
    ):
        batch = self.sequences.shape[0]
        stops = torch.tensor(list(stop_tokens or []), device=self.device, dtype=torch.long)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        steps, trajectories, chosen_from = [], [], []
        logits, state = self._full_forward()
        used = torch.full((batch,), self.depth, dtype=torch.long, device=self.device)
        for t in range(max_new_tokens):
            token = select_token(logits, **sampling)
            if return_logits:
                chosen_from.append(logits.float())
            token = torch.where(finished, torch.full_like(token, pad_token_id), token)
            self._append(token)
            steps.append(used)
            if stops.numel():
                finished |= torch.isin(token, stops)
            if bool(finished.all()) or t == max_new_tokens - 1:
                break
            if self.cache is None:
                logits, state = self._full_forward()
            else:
                logits, state, used, trajectory = self._decode_one(
                    token, criterion, state if continuous else None, return_trajectory
                )
                if trajectory is not None:
                    trajectories.append(trajectory)
        steps_tensor = torch.stack(steps, dim=1) if steps else torch.zeros(batch, 0, dtype=torch.long)
        out = GenerationOutput(self.sequences, steps_tensor, 0.0, trajectories)
        if return_logits:
            out.logits = torch.stack(chosen_from, dim=1)
        return out

    def _decode_one(self, token, criterion, warm_state, return_trajectory):
        """One new token through prelude, core (iteration by iteration, with optional exit) and coda."""
        model, cache = self.model, self.cache
        ctx: StepContext = model.context(1, self.mask, cache=cache)
        if self.compiled is not None:
            ctx = self._static_context(ctx)
        embeds = self._embed(token[:, None], ctx)
        state = model.initialize_state(embeds, self.init_scale) if warm_state is None else warm_state
        batch = token.shape[0]
        used = torch.full((batch,), self.depth, dtype=torch.long, device=self.device)
        trajectory = []
        if criterion is None:
            for i in range(self.depth):
                state = self._core(state, embeds, ctx, i)
                if return_trajectory:
                    trajectory.append(state[:, -1])
        else:
            criterion.reset()
            cache.ensure_slots(model.config.n_layers_in_recurrent_block, self.depth)
            active = torch.ones(batch, dtype=torch.bool, device=self.device)
            for i in range(self.depth):
                ctx.rows = active
                new_state = self._core(state, embeds, ctx, i)
                state = torch.where(active[:, None, None], new_state, state)
                if return_trajectory:
                    trajectory.append(state[:, -1])
                if i == self.depth - 1:
                    break
                logits = self._predict(state, ctx) if criterion.needs_logits else None
                exited = criterion.check(state, logits) & active
                if bool(exited.any()):
                    used[exited] = i + 1
                    cache.fill_skipped(exited, cache.length, i + 1)
                    active &= ~exited
                    if not bool(active.any()):
                        break
            ctx.rows = None
        logits = self._predict(state, ctx)
        cache.advance(1)
        return logits[:, -1], state, used, (torch.stack(trajectory) if return_trajectory else None)

    # The pieces of one new token, eager or compiled ------------------------------------------------------------
    def _static_context(self, ctx: StepContext) -> StepContext:
        """``ctx`` for a compiled step, with a mask over the whole cache (keys written so far and not padding);
        keeps the position to write as a tensor."""
        cache = self.cache
        written = torch.arange(cache.capacity, device=self.device) <= cache.length
        if self.mask is not None:
            written = written & F.pad(self.mask.bool(), (0, cache.capacity - self.mask.shape[1]))
        self.position.fill_(cache.length)
        self.views = {}
        return dataclasses.replace(ctx, mask=written.view(-1, 1, 1, cache.capacity))

    def _slots(self, ctx: StepContext, iteration: int) -> StepContext:
        """``ctx`` with the buffers of ``iteration``'s slot, built once per token and slot."""
        slot = self.cache.slot(iteration)
        if slot not in self.views:
            if slot not in self.slot_buffers:  # the buffers stay put once the prefill allocated them
                self.slot_buffers[slot] = DecodeSlots(self.cache, iteration, self.position)
            # start = 0: the position travels as a tensor, so a compiled graph never specialises on it
            self.views[slot] = dataclasses.replace(ctx, cache=self.slot_buffers[slot], start=0)
        view = self.views[slot]
        view.rows = ctx.rows
        return view

    def _embed(self, tokens: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        if self.compiled is None:
            return self.model.embed(tokens, ctx)
        return self.compiled.embed(self.model, tokens, self._slots(ctx, 0))

    def _core(
        self, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext, iteration: int
    ) -> torch.Tensor:
        if self.compiled is None:
            return self.model.core_step(state, embeds, ctx, iteration)
        return self.compiled.core(self.model, state, embeds, self._slots(ctx, iteration))

    def _predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        if self.compiled is None:
            return self.model.predict(state, ctx)
        return self.compiled.predict(self.model, state, self._slots(ctx, 0))

    def speculative(self, max_new_tokens, draft_depth, draft_tokens, stop_tokens, sampling):
        """Draft ``draft_tokens`` at ``draft_depth``, verify all in one full-depth pass, keep the agreeing prefix
        plus the full model's own next token. Every kept token is what the full model chooses."""
        model, cache = self.model, self.cache
        stops = set(stop_tokens or [])
        if self.mask is not None and not bool(self.mask.all()):
            raise UsageError("speculative decoding takes an unpadded prompt")
        logits, _ = self._full_forward()
        pending = select_token(logits, **sampling)
        produced: list[int] = []
        steps: list[int] = []
        while len(produced) < max_new_tokens:
            committed = cache.length
            drafts, token = [], pending
            for _ in range(min(draft_tokens, max_new_tokens - len(produced) - 1)):
                out = model(token[:, None], num_steps=draft_depth, init_scale=self.init_scale, cache=cache)
                token = out.logits[:, -1].argmax(-1)
                drafts.append(token)
            cache.truncate(committed)
            block = torch.stack([pending, *drafts], dim=1)
            out = model(block, num_steps=self.depth, init_scale=self.init_scale, cache=cache)
            targets = [select_token(out.logits[:, j], **sampling) for j in range(block.shape[1])]
            accepted = 0
            while accepted < len(drafts) and int(drafts[accepted]) == int(targets[accepted]):
                accepted += 1
            new = [int(pending)] + [int(d) for d in drafts[:accepted]]
            cache.truncate(committed + accepted + 1)
            pending = targets[accepted]
            for tok in new:
                if len(produced) < max_new_tokens:
                    produced.append(tok)
                    steps.append(self.depth)
            if stops & set(new):
                cut = next(i for i, t in enumerate(produced) if t in stops) + 1
                produced, steps = produced[:cut], steps[:cut]
                break
        new_tokens = torch.tensor([produced], dtype=torch.long, device=self.device)
        self.sequences = torch.cat([self.sequences, new_tokens], dim=1)
        return GenerationOutput(self.sequences, torch.tensor([steps], dtype=torch.long), 0.0)


def _embed_step(model: RecurrentDepthLM, tokens: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.embed(tokens, ctx)


def _core_step(
    model: RecurrentDepthLM, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext
) -> torch.Tensor:
    return model.core_step(state, embeds, ctx, 0)  # ctx.cache already holds this iteration's slot


def _predict_step(model: RecurrentDepthLM, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.predict(state, ctx)


@functools.cache
def _compiled_steps() -> SimpleNamespace:
    """The three pieces of a new token, each compiled once per process (graphs are cached by shape)."""
    # cpp_wrapper: the graph's kernels are launched from C++, not from a Python wrapper (1.2-1.3x per token)
    options = dict(fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
    return SimpleNamespace(
        embed=torch.compile(_embed_step, **options),
        core=torch.compile(_core_step, **options),
        predict=torch.compile(_predict_step, **options),
    )
