"""Decoding strategies for the recurrent-depth LM: how :func:`~latentloop.models.generation.generate` turns a
prompt into new tokens once its settings are checked.

- :class:`SequentialDecoding`: the prompt is prefilled at full depth in one pass; each new token then runs the
  prelude once, the core one iteration at a time (so a row can stop early at the exit criterion) and the coda
  once. KV-cache sharing, continuous chain of thought and compiled steps live here.
- :class:`SpeculativeDecoding`: self-speculative decoding, drafting at a shallow depth and verifying at full depth.
- :class:`ParallelDecoding`: the diffusion-style parallel sampler of :mod:`latentloop.models.parallel_sampler`.

With ``compile=True`` the three pieces of a new token run as ``torch.compile`` graphs. At batch 1 on a CPU,
eager decoding spends about half its time dispatching small kernels (norms, rotations, residuals) around the
matrix-vector products; a compiled graph fuses them. The graphs see only fixed shapes (the cache is sized for
the whole call, to a power of two, and attention masks what is not yet written; see
:class:`~latentloop.models.kv_cache.DecodeSlots`), so one compilation serves every token, iteration and cache
slot of every later call of that size.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from latentloop.errors import UsageError
from latentloop.models.exit_criteria import ExitCriterion
from latentloop.models.kv_cache import DecodeSlots, RecurrentKVCache
from latentloop.models.parallel_sampler import parallel_generate
from latentloop.nn.quantized import activation_dtype
from latentloop.nn.screened import ScreenedArgmax

if TYPE_CHECKING:  # annotations only: generation imports this module, recurrent_depth imports generation
    from latentloop.models.generation import GenerationConfig
    from latentloop.models.looped import LoopedLM
    from latentloop.models.recurrent_depth import StepContext

# Picks a token from each row of logits [B, V]: greedy or sampled, as the config says.
Choose = Callable[[torch.Tensor], torch.Tensor]


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
    # [n]: core passes run, one after another, before each new token was chosen, where they differ from
    # ``steps`` (a decoder that defers a token's iterations after its exit; see SequentialDecoding)
    passes: torch.Tensor | None = None

    @property
    def new_tokens(self) -> int:
        return self.steps.shape[1]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens * self.sequences.shape[0] / max(self.seconds, 1e-9)

    @property
    def mean_steps(self) -> float:
        return float(self.steps.float().mean()) if self.steps.numel() else 0.0

    @property
    def mean_passes(self) -> float:
        """Sequential core passes per new token: ``passes``' mean where recorded, else :attr:`mean_steps`."""
        if self.passes is None:
            return self.mean_steps
        return float(self.passes.float().mean()) if self.passes.numel() else 0.0


class DecodingStrategy:
    """One way of continuing a prompt under a checked :class:`~latentloop.models.generation.GenerationConfig`."""

    def __init__(self, config: GenerationConfig) -> None:
        self.config = config

    def capacity(self, input_ids: torch.Tensor) -> int:
        """Positions the sequence occupies at most: the prompt and every new token."""
        return input_ids.shape[1] + self.config.max_new_tokens

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, depth: int) -> None:
        """Refuses, with a :class:`UsageError`, a prompt or depth this strategy cannot decode."""

    def decode(
        self,
        model: LoopedLM,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        depth: int,
        choose: Choose,
        screen: ScreenedArgmax | None = None,
    ) -> GenerationOutput:
        """New tokens after ``input_ids`` [B, T0] at ``depth`` core iterations per token (in inference mode)."""
        raise NotImplementedError


def decoding_strategy(config: GenerationConfig) -> DecodingStrategy:
    """Sequential decoding, unless the config asks for the parallel sampler or speculative decoding."""
    if config.parallel is not None:
        return ParallelDecoding(config)
    if config.speculative is not None:
        return SpeculativeDecoding(config)
    return SequentialDecoding(config)


class Sequences:
    """The growing sequences, their mask and the KV cache during one call."""

    def __init__(
        self,
        model: LoopedLM,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        depth: int,
        config: GenerationConfig,
        capacity: int,
    ) -> None:
        self.model, self.depth, self.init_scale = model, depth, config.init_scale
        self.device = model.embedding.weight.device
        self.ids = input_ids.to(self.device)
        self.mask = None if attention_mask is None else attention_mask.to(self.device).long()
        self.cache = None
        if config.use_cache:
            model_config, dtype = model.config, activation_dtype(model.embedding)
            self.cache = RecurrentKVCache(
                input_ids.shape[0],
                model_config.n_heads,
                model_config.head_dim,
                capacity,
                config.kv_share,
                dtype,
                self.device,
            )

    def full_forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits [B, V] and the final state [B, 1, h] of the last position: the whole sequence at
        full depth (the prefill, or every token without a cache)."""
        out = self.model(
            self.ids,
            num_steps=self.depth,
            init_scale=self.init_scale,
            attention_mask=self.mask,
            cache=self.cache,
        )
        return out.logits[:, -1], out.latent_states[:, -1:]

    def full_forward_exit(self, criterion: ExitCriterion) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`full_forward` with the last position read from the step where ``criterion`` exits (every step
        is still computed, as the cache needs them). Only for criteria that read states, not logits, on models
        without a coda (the step's logits come from ``predict`` without the sequence's context)."""
        model = self.model
        out = model(
            self.ids,
            num_steps=self.depth,
            init_scale=self.init_scale,
            attention_mask=self.mask,
            cache=self.cache,
            return_trajectory=True,
        )
        states = out.trajectory[:, :, -1:]  # [steps, B, 1, h]
        chosen = states[-1]
        active = torch.ones(states.shape[1], dtype=torch.bool, device=self.device)
        criterion.reset()
        for i in range(self.depth - 1):
            exited = criterion.check(states[i], None) & active
            chosen = torch.where(exited[:, None, None], states[i], chosen)
            active &= ~exited
        return model.predict(chosen, model.context(1))[:, -1], chosen

    def append(self, tokens: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, torch.ones_like(tokens)[:, None]], dim=1)


class SequentialDecoding(DecodingStrategy):
    """One token after another, each with up to ``depth`` core iterations of its own.

    A criterion that computes every step (``gate-full``) reads each token at its exit step, but later tokens
    attend to every step of it. Eager decoding defers those later steps: the token is chosen once it exits,
    and its remaining iterations run in the passes of the tokens after it, as extra positions of the same
    products (:class:`_DeferredSteps`), when a later token first runs the same iteration. Every step a chosen
    token depends on is computed, with the same inputs, so the tokens are the same; a step no later token
    reaches is never computed, and a token waits only for its own exit. At a few rows decoding is bound by
    reading the weights, which a pass reads once however many positions it carries.
    """

    def decode(
        self,
        model: LoopedLM,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        depth: int,
        choose: Choose,
        screen: ScreenedArgmax | None = None,
    ) -> GenerationOutput:
        config = self.config
        capacity = self.capacity(input_ids)
        if config.compile:
            # Few distinct sizes, so few compilations; attention over the unwritten tail is masked.
            capacity = min(model.config.block_size, max(64, 1 << (capacity - 1).bit_length()))
        seq = Sequences(model, input_ids, attention_mask, depth, config, capacity)
        pieces = _CompiledPieces(seq, screen) if config.compile else _EagerPieces(model, screen)
        criterion = config.criterion()
        if criterion is not None:
            criterion.bind(model)
        deferred = _DeferredSteps() if self._defers(model, criterion, seq) else None
        batch = seq.ids.shape[0]
        stops = torch.tensor(list(config.stop_tokens or []), device=seq.device, dtype=torch.long)
        finished = torch.zeros(batch, dtype=torch.bool, device=seq.device)
        spent, trajectories, chosen_from = [], [], []
        if criterion is not None and criterion.at_prefill and seq.cache is not None:
            logits, state = seq.full_forward_exit(criterion)
        else:
            logits, state = seq.full_forward()
        used = torch.full((batch,), depth, dtype=torch.long, device=seq.device)
        for t in range(config.max_new_tokens):
            token = choose(logits)
            if config.return_logits:
                chosen_from.append(logits.float())
            token = torch.where(finished, torch.full_like(token, config.pad_token_id), token)
            seq.append(token)
            spent.append(used)
            if stops.numel():
                finished |= torch.isin(token, stops)
            if bool(finished.all()) or t == config.max_new_tokens - 1:
                break
            if seq.cache is None:
                logits, state = seq.full_forward()
                continue
            warm = (
                state if config.continuous else None
            )  # continuous thought: start from the last token's state
            if deferred is not None:
                logits, state, used = self._next_token_deferred(seq, pieces, token, criterion, deferred)
                continue
            logits, state, used, trajectory = self._next_token(seq, pieces, token, criterion, warm)
            if trajectory is not None:
                trajectories.append(trajectory)
        spent_tensor = torch.stack(spent, dim=1) if spent else torch.zeros(batch, 0, dtype=torch.long)
        out = GenerationOutput(seq.ids, spent_tensor, 0.0, trajectories)
        if deferred is not None:
            out.passes = spent_tensor[0]  # what each token waited for, the same in every row
            # A deferred iteration counts once it ran: one a later token never reached was never computed.
            ran = torch.tensor([depth, *deferred.iterations(depth)], dtype=torch.long, device=seq.device)
            out.steps = ran[: len(spent)].expand(batch, -1)
        if config.return_logits:
            out.logits = torch.stack(chosen_from, dim=1)
        return out

    def _defers(self, model: LoopedLM, criterion: ExitCriterion | None, seq: Sequences) -> bool:
        """Whether the iterations after a token's exit can wait for the next tokens' passes: a criterion that
        computes every step, eager decoding with one cache slot per iteration, and a loop whose iterations read
        nothing but their own state (no injected input, no coda writing the cache after the exit)."""
        config, loop = self.config, model.loop
        return (
            criterion is not None
            and criterion.computes_every_step
            and seq.cache is not None
            and not (config.compile or config.return_trajectory or config.continuous)
            and config.kv_share is None
            and not (loop.input_injection or loop.coda or loop.prelude)
        )

    def _next_token_deferred(
        self,
        seq: Sequences,
        pieces: _EagerPieces,
        token: torch.Tensor,
        criterion: ExitCriterion,
        deferred: _DeferredSteps,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One new token, read at its exit step, with the deferred iterations of the positions before it run
        in the same passes: the next logits [B, V], the chosen state [B, 1, h] and the passes run [B]."""
        model, cache, depth = seq.model, seq.cache, seq.depth
        position = cache.length
        ctx = model.context(1, seq.mask, cache=cache)
        embeds = pieces.embed(token[:, None], ctx)
        state = model.initialize_state(embeds, seq.init_scale)
        criterion.reset()
        active = torch.ones(token.shape[0], dtype=torch.bool, device=seq.device)
        chosen = state
        for i in range(depth):
            # Positions before this one that have run exactly i iterations run their next one alongside it.
            behind = deferred.behind(i)
            rows = torch.cat([deferred.states[:, -behind:], state], dim=1) if behind else state
            step_ctx = model.context(behind + 1, seq.mask, cache=cache, start=position - behind)
            out = pieces.core(rows, rows, step_ctx, i)  # no injected input (see _defers): embeds unused
            deferred.advance(out[:, :-1], behind)
            state = out[:, -1:]
            exited = active if i == depth - 1 else criterion.check(state, None) & active
            chosen = torch.where(exited[:, None, None], state, chosen)
            active &= ~exited
            if not bool(active.any()):
                deferred.push(state, i + 1, depth)
                break
        logits = pieces.next_logits(chosen, ctx)
        cache.advance(1)
        return logits[:, -1], chosen, torch.full_like(token, i + 1)

    def _next_token(
        self,
        seq: Sequences,
        pieces: _EagerPieces | _CompiledPieces,
        token: torch.Tensor,
        criterion: ExitCriterion | None,
        warm_state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One new token through prelude, core (iteration by iteration, with optional exit) and coda: the next
        logits [B, V], the final state, the iterations each row ran and (on request) the states on the way."""
        model, cache, depth = seq.model, seq.cache, seq.depth
        ctx = pieces.context(model.context(1, seq.mask, cache=cache), seq.mask)
        embeds = pieces.embed(token[:, None], ctx)
        state = model.initialize_state(embeds, seq.init_scale) if warm_state is None else warm_state
        batch = token.shape[0]
        used = torch.full((batch,), depth, dtype=torch.long, device=seq.device)
        keep = self.config.return_trajectory
        trajectory = []
        if criterion is None:
            for i in range(depth):
                state = pieces.core(state, embeds, ctx, i)
                if keep:
                    trajectory.append(state[:, -1])
        elif criterion.computes_every_step:
            criterion.reset()
            active = torch.ones(batch, dtype=torch.bool, device=seq.device)
            chosen = state
            for i in range(depth):
                state = pieces.core(state, embeds, ctx, i)
                if keep:
                    trajectory.append(state[:, -1])
                exited = active if i == depth - 1 else criterion.check(state, None) & active
                chosen = torch.where(exited[:, None, None], state, chosen)
                active &= ~exited
            state = chosen
        else:
            criterion.reset()
            cache.ensure_slots(model.config.n_layers_in_recurrent_block, depth)
            active = torch.ones(batch, dtype=torch.bool, device=seq.device)
            for i in range(depth):
                ctx.rows = active
                new_state = pieces.core(state, embeds, ctx, i)
                state = torch.where(active[:, None, None], new_state, state)
                if keep:
                    trajectory.append(state[:, -1])
                if i == depth - 1:
                    break
                logits = pieces.predict(state, ctx) if criterion.needs_logits else None
                exited = criterion.check(state, logits) & active
                if bool(exited.any()):
                    used[exited] = i + 1
                    # Later tokens attend to every iteration's slot: an exited row offers its deepest one there.
                    cache.fill_skipped(exited, cache.length, i + 1)
                    active &= ~exited
                    if not bool(active.any()):
                        break
            ctx.rows = None
        logits = pieces.next_logits(state, ctx)
        cache.advance(1)
        return logits[:, -1], state, used, (torch.stack(trajectory) if keep else None)


class _DeferredSteps:
    """The positions whose later iterations are still to run: their states ``[B, P, h]`` (the last P
    positions before the current one) after ``progress`` iterations each. Every row has run the same
    iterations at a position (a pass runs until every row's token has exited), and ``progress`` never
    increases along the positions, so the positions that have run exactly i iterations are always the last
    ones: the next pass writes iteration i's cache slot from the first of them on, after the positions that
    already hold it."""

    def __init__(self) -> None:
        self.states: torch.Tensor | None = None
        self.progress: list[int] = []
        self.finished = 0  # positions that have run every iteration and left

    def behind(self, iteration: int) -> int:
        """How many of the last positions have run exactly ``iteration`` iterations."""
        count = 0
        for done in reversed(self.progress):
            if done != iteration:
                break
            count += 1
        return count

    def advance(self, states: torch.Tensor, count: int) -> None:
        """The last ``count`` positions ran one more iteration and reached ``states``."""
        if count:
            self.states[:, -count:] = states
            self.progress[-count:] = [done + 1 for done in self.progress[-count:]]

    def push(self, state: torch.Tensor, done: int, depth: int) -> None:
        """The new position, after ``done`` iterations; positions that ran all ``depth`` leave."""
        self.states = state if self.states is None else torch.cat([self.states, state], dim=1)
        self.progress.append(done)
        finished = sum(1 for p in self.progress if p == depth)
        if finished:
            self.states, self.progress = self.states[:, finished:], self.progress[finished:]
            self.finished += finished

    def iterations(self, depth: int) -> list[int]:
        """The iterations each position pushed so far has run, in order."""
        return [depth] * self.finished + self.progress


class _Pieces:
    """The pieces of a new token; the next token's logits come through ``screen`` where one is given."""

    screen: ScreenedArgmax | None

    def predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        raise NotImplementedError

    def head_input(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        raise NotImplementedError

    def next_logits(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """The logits the next token is chosen from: all of them, or the screen's (greedy tokens only) where
        screening this many rows is faster here."""
        rows = state.shape[0] * state.shape[1]
        if self.screen is None or not self.screen.pays_off(rows, self.model.lm_head):
            return self.predict(state, ctx)
        return self.screen.logits(self.head_input(state, ctx))


class _EagerPieces(_Pieces):
    """The pieces of a new token as the model's own methods."""

    def __init__(self, model: LoopedLM, screen: ScreenedArgmax | None = None) -> None:
        self.model, self.screen = model, screen

    def context(self, ctx: StepContext, mask: torch.Tensor | None) -> StepContext:
        return ctx

    def embed(self, tokens: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.model.embed(tokens, ctx)

    def core(
        self, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext, iteration: int
    ) -> torch.Tensor:
        return self.model.core_step(state, embeds, ctx, iteration)

    def predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.model.predict(state, ctx)

    def head_input(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.model.head_input(state, ctx)


class _CompiledPieces(_Pieces):
    """The pieces of a new token as compiled graphs over fixed-size views of the cache."""

    def __init__(self, seq: Sequences, screen: ScreenedArgmax | None = None) -> None:
        self.model, self.cache, self.device, self.screen = seq.model, seq.cache, seq.device, screen
        self.graphs = _compiled_steps()
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)  # where a compiled step writes
        self.slot_buffers: dict[int, DecodeSlots] = {}
        self.views: dict[int, StepContext] = {}  # this token's contexts, by slot

    def context(self, ctx: StepContext, mask: torch.Tensor | None) -> StepContext:
        """``ctx`` with a mask over the whole cache (keys written so far and not padding); keeps the position
        to write as a tensor."""
        cache = self.cache
        written = torch.arange(cache.capacity, device=self.device) <= cache.length
        if mask is not None:
            written = written & F.pad(mask.bool(), (0, cache.capacity - mask.shape[1]))
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

    def embed(self, tokens: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.graphs.embed(self.model, tokens, self._slots(ctx, 0))

    def core(
        self, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext, iteration: int
    ) -> torch.Tensor:
        return self.graphs.core(self.model, state, embeds, self._slots(ctx, iteration))

    def predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.graphs.predict(self.model, state, self._slots(ctx, 0))

    def head_input(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.graphs.head_input(self.model, state, self._slots(ctx, 0))


def _embed_step(model: LoopedLM, tokens: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.embed(tokens, ctx)


def _core_step(model: LoopedLM, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.core_step(state, embeds, ctx, 0)  # ctx.cache already holds this iteration's slot


def _predict_step(model: LoopedLM, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.predict(state, ctx)


def _head_input_step(model: LoopedLM, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model.head_input(state, ctx)


@functools.cache
def _compiled_steps() -> SimpleNamespace:
    """The pieces of a new token, each compiled once per process (graphs are cached by shape)."""
    # cpp_wrapper: the graph's kernels are launched from C++, not from a Python wrapper (1.2-1.3x per token)
    options = dict(fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
    return SimpleNamespace(
        embed=torch.compile(_embed_step, **options),
        core=torch.compile(_core_step, **options),
        predict=torch.compile(_predict_step, **options),
        head_input=torch.compile(_head_input_step, **options),
    )


class SpeculativeDecoding(DecodingStrategy):
    """Self-speculative decoding: draft ``draft_tokens`` tokens greedily at ``speculative`` core iterations,
    verify them all in one full-depth pass, and keep the agreeing prefix plus the full model's own next token.
    Every kept token is what the full model chooses."""

    def capacity(self, input_ids: torch.Tensor) -> int:
        return super().capacity(input_ids) + self.config.draft_tokens + 1  # a round may overshoot by a draft

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, depth: int) -> None:
        if self.config.speculative > depth:
            raise UsageError(
                f"speculative draft depth must be between 1 and num_steps ({depth}), got {self.config.speculative}"
            )
        if input_ids.shape[0] != 1:
            raise UsageError("speculative decoding runs one sequence at a time (batch size 1)")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise UsageError("speculative decoding takes an unpadded prompt")

    def decode(
        self,
        model: LoopedLM,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        depth: int,
        choose: Choose,
        screen: ScreenedArgmax | None = None,
    ) -> GenerationOutput:
        config = self.config
        max_new_tokens, init_scale = config.max_new_tokens, config.init_scale
        seq = Sequences(model, input_ids, attention_mask, depth, config, self.capacity(input_ids))
        cache = seq.cache
        stops = set(config.stop_tokens or [])
        logits, _ = seq.full_forward()
        pending = choose(logits)
        produced: list[int] = []
        while len(produced) < max_new_tokens:
            committed = cache.length
            drafts, token = [], pending
            for _ in range(min(config.draft_tokens, max_new_tokens - len(produced) - 1)):
                out = model(token[:, None], num_steps=config.speculative, init_scale=init_scale, cache=cache)
                token = out.logits[:, -1].argmax(-1)
                drafts.append(token)
            cache.truncate(committed)
            block = torch.stack([pending, *drafts], dim=1)
            out = model(block, num_steps=depth, init_scale=init_scale, cache=cache)
            targets = [choose(out.logits[:, j]) for j in range(block.shape[1])]
            accepted = 0
            while accepted < len(drafts) and int(drafts[accepted]) == int(targets[accepted]):
                accepted += 1
            new = [int(pending)] + [int(d) for d in drafts[:accepted]]
            cache.truncate(committed + accepted + 1)
            pending = targets[accepted]
            produced += new[: max_new_tokens - len(produced)]
            if stops & set(new):
                produced = produced[: next(i for i, t in enumerate(produced) if t in stops) + 1]
                break
        new_tokens = torch.tensor([produced], dtype=torch.long, device=seq.device)
        sequences = torch.cat([seq.ids, new_tokens], dim=1)
        return GenerationOutput(sequences, torch.full((1, len(produced)), depth, dtype=torch.long), 0.0)


class ParallelDecoding(DecodingStrategy):
    """The parallel sampler: a wavefront of positions iterated together (see
    :mod:`latentloop.models.parallel_sampler`)."""

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, depth: int) -> None:
        if attention_mask is not None:
            raise UsageError("the parallel sampler does not combine with attention_mask")

    def decode(
        self,
        model: LoopedLM,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        depth: int,
        choose: Choose,
        screen: ScreenedArgmax | None = None,
    ) -> GenerationOutput:
        config = self.config
        sequences, steps, sweeps = parallel_generate(
            model,
            input_ids,
            config.max_new_tokens,
            depth,
            config.init_scale,
            config.parallel,
            config.stop_tokens,
            choose,
        )
        return GenerationOutput(sequences, steps, 0.0, sweeps=sweeps)
