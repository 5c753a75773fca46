"""Continuous batching for looped LMs: concurrent requests decoded as one batch, each at its own depth and exit.

A request is prefilled alone at its depth (exactly as :func:`~latentloop.models.generation.generate` prefills
it), then joins the running batch between two tokens. Every round, each row picks its next token from its own
logits (greedy or sampled with its own generator), and the batch runs one new token for every row:

- the rows share one KV cache, left-padded so that all write the same position; positions count only a row's
  own tokens, so a row sees exactly what it would alone (``attention_mask`` in
  :func:`~latentloop.models.recurrent_depth.step_context`);
- the core runs up to the deepest row's depth, each iteration over the rows still running: a row stops after
  its own depth, or where its exit criterion says so (skipped slots are filled as sequential decoding fills
  them), and a criterion that computes every step (``gate-full``) only chooses which step the row's token is
  read from;
- a row that finishes or whose client went away leaves between two tokens, and the cache is rebuilt without it.

So each row's token comes from the same computation as a call of ``generate`` with the same settings, in a
batch of other rows. The engine runs in one thread (:meth:`Engine.start`); :meth:`Engine.submit` may be called
from any thread.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from latentloop.errors import UsageError
from latentloop.models.decoding import Sequences
from latentloop.models.exit_criteria import ExitCriterion
from latentloop.models.generation import GenerationConfig, check_loop, select_token
from latentloop.models.kv_cache import LayerKey, RecurrentKVCache
from latentloop.models.looped import LoopedLM
from latentloop.models.recurrent_depth import StepContext
from latentloop.nn import KVHook
from latentloop.nn.quantized import activation_dtype

# The GenerationConfig fields a request may set; the rest are the deployment's or belong to other decoders.
REQUEST_FIELDS = (
    "max_new_tokens",
    "num_steps",
    "init_scale",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "stop_tokens",
    "exit",
    "continuous",
)


@dataclass(frozen=True)
class Token:
    """One new token of a request and the core iterations it ran (its depth); where the request asks for
    log-probabilities, the token's and the ``top`` most likely ones (id, log-probability)."""

    id: int
    steps: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Finished:
    """The end of a request: ``reason`` is ``"stop"`` (a stop token), ``"length"`` (max_new_tokens),
    ``"cancelled"`` (its client left) or ``"error"`` (``message`` says why)."""

    reason: str
    message: str = ""


Event = Token | Finished


@dataclass(eq=False)
class Request:
    """A prompt (token ids) and how to continue it. ``emit`` receives its events in order, from the engine's
    thread: one :class:`Token` per new token, then one :class:`Finished`. Without ``emit`` they queue up in
    :attr:`events`."""

    prompt: list[int]
    config: GenerationConfig = field(default_factory=GenerationConfig)
    seed: int | None = None
    logprobs: int | None = None  # how many of the most likely tokens to report with each token
    emit: Callable[[Event], None] | None = None
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    cancelled: bool = False
    finished: bool = False

    def cancel(self) -> None:
        """Ask the engine to drop this request before its next token (a client that went away)."""
        self.cancelled = True

    def send(self, event: Event) -> None:
        if self.finished:
            return
        self.finished = isinstance(event, Finished)
        (self.emit or self.events.put)(event)

    def tokens(self) -> tuple[list[Token], Finished]:
        """Blocks until the request ends: its tokens and how it ended (for requests without ``emit``)."""
        tokens = []
        while True:
            event = self.events.get()
            if isinstance(event, Finished):
                return tokens, event
            tokens.append(event)


@dataclass(eq=False)
class _Row:
    """A request in the running batch."""

    request: Request
    depth: int
    criterion: ExitCriterion | None
    choose: Callable[[torch.Tensor], torch.Tensor]
    stops: frozenset[int]
    logits: torch.Tensor  # [V]: the next token's
    state: torch.Tensor  # [1, h]: the last token's chosen state (continuous thought starts from it)
    source: RecurrentKVCache  # where its keys and values are now
    index: int  # its row there
    length: int  # positions it holds in the cache
    produced: int = 0
    last_steps: int = 0  # core iterations the last decode step ran for it
    pending: int | None = None  # the token chosen this round, which the next decode step writes

    @property
    def remaining(self) -> int:
        return self.request.config.max_new_tokens - self.produced

    @property
    def spec(self) -> tuple[str, str]:
        """Its exit criterion's name and threshold (rows with the same one share an instance)."""
        return (self.criterion.name, repr(self.criterion.threshold))


class Engine:
    """Serves ``model`` to concurrent requests: at most ``max_batch`` decode together, the others wait in
    order. ``kv_share`` is the deployment's number of core cache slots (None: one per iteration)."""

    def __init__(self, model: LoopedLM, max_batch: int = 16, kv_share: int | None = None) -> None:
        if max_batch < 1:
            raise UsageError(f"max_batch must be at least 1, got {max_batch}")
        self.model, self.max_batch, self.kv_share = model.eval(), max_batch, kv_share
        self.device = model.embedding.weight.device
        self.rows: list[_Row] = []
        self.admitted: list[_Row] = []  # prefilled this round, not yet in the batch
        self.cache: RecurrentKVCache | None = None
        self.mask: torch.Tensor | None = None
        self.waiting: deque[Request] = deque()
        self.criteria: dict[
            tuple[str, str], ExitCriterion
        ] = {}  # one instance per spec, shared by the rows using it
        self.lock = threading.Condition()
        self.closing = False
        self.thread: threading.Thread | None = None

    # Requests ---------------------------------------------------------------------------------------------------
    def check(self, request: Request) -> int:
        """Refuses (:class:`UsageError`) a request this engine cannot serve; returns its depth."""
        config, model = request.config, self.model
        defaults = GenerationConfig()
        other = [
            f.name
            for f in dataclasses.fields(GenerationConfig)
            if f.name not in REQUEST_FIELDS and getattr(config, f.name) != getattr(defaults, f.name)
        ]
        if other:
            raise UsageError(f"a served request cannot set {', '.join(other)}")
        if not request.prompt:
            raise UsageError("the prompt is empty: give at least one token")
        if min(request.prompt) < 0 or max(request.prompt) >= model.config.vocab_size:
            raise UsageError(f"prompt token ids must lie in [0, {model.config.vocab_size})")
        if config.max_new_tokens < 1:
            raise UsageError("max_tokens must be at least 1")
        total = len(request.prompt) + config.max_new_tokens
        if total > model.config.block_size:
            raise UsageError(
                f"prompt ({len(request.prompt)} tokens) plus max_tokens ({config.max_new_tokens}) exceed the "
                f"model's context of {model.config.block_size}"
            )
        check_loop(model, config)
        criterion = config.criterion()
        if criterion is not None:
            criterion.bind(model)
        return config.depth(model)

    def submit(self, request: Request) -> Request:
        """Queues ``request`` (checked first: a bad one raises :class:`UsageError` here, not later)."""
        self.check(request)
        with self.lock:
            if self.closing:
                raise RuntimeError("the engine is shutting down")
            self.waiting.append(request)
            self.lock.notify()
        return request

    @property
    def busy(self) -> int:
        """Requests decoding or waiting."""
        return len(self.rows) + len(self.waiting)

    # The engine thread ------------------------------------------------------------------------------------------
    def start(self) -> Engine:
        """Runs the engine in a background thread until :meth:`close`."""
        self.thread = threading.Thread(target=self._serve, name="latentloop-engine", daemon=True)
        self.thread.start()
        return self

    def close(self, drain: bool = True) -> None:
        """Stops taking requests; with ``drain`` finishes those in flight (the waiting ones too), else cancels
        them. Returns once the engine thread has ended."""
        with self.lock:
            self.closing = True
            if not drain:
                for request in [*self.waiting, *(row.request for row in self.rows)]:
                    request.cancel()
            self.lock.notify()
        if self.thread is not None:
            self.thread.join()

    def _serve(self) -> None:
        while True:
            with self.lock:
                while not self.rows and not self.waiting and not self.closing:
                    self.lock.wait()
                if self.closing and not self.rows and not self.waiting:
                    return
            try:
                self.step()
            except Exception as error:  # a failure ends the requests in flight, not the server
                message = f"{type(error).__name__}: {error}"
                for row in [*self.rows, *self.admitted]:
                    row.request.send(Finished("error", message))
                self.rows, self.admitted, self.cache, self.mask = [], [], None, None

    def step(self) -> None:
        """One round: admit waiting requests, give every row its next token, and decode the batch one token."""
        self.admitted = admitted = self._admit()
        survivors = []
        for row in [*self.rows, *admitted]:
            reason = self._next_token(row)
            if reason is None:
                survivors.append(row)
            else:
                row.request.send(Finished(reason))
        if admitted or len(survivors) != len(self.rows):
            self._rebuild(survivors)
        self.admitted = []
        if survivors:
            self._decode()

    def _admit(self) -> list[_Row]:
        admitted = []
        while True:
            with self.lock:
                if not self.waiting or len(self.rows) + len(admitted) >= self.max_batch:
                    return admitted
                request = self.waiting.popleft()
            if request.cancelled:
                request.send(Finished("cancelled"))
                continue
            try:
                admitted.append(self._prefill(request))
            except Exception as error:  # a prompt that fails ends its own request, not the batch
                message = str(error) if isinstance(error, UsageError) else f"{type(error).__name__}: {error}"
                request.send(Finished("error", message))

    def _prefill(self, request: Request) -> _Row:
        """The prompt alone at its depth, as ``generate`` prefills it."""
        model, config = self.model, dataclasses.replace(request.config, kv_share=self.kv_share)
        depth = self.check(request)
        ids = torch.tensor([request.prompt], device=self.device)
        sequences = Sequences(model, ids, None, depth, config, len(request.prompt) + config.max_new_tokens)
        criterion = config.criterion()
        if criterion is not None:
            criterion.bind(model)
        with torch.inference_mode():
            if criterion is not None and criterion.at_prefill:
                logits, state = sequences.full_forward_exit(criterion)
            else:
                logits, state = sequences.full_forward()
        generator = None
        if request.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
        choose = functools.partial(
            select_token,
            do_sample=config.do_sample,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            generator=generator,
        )
        return _Row(
            request,
            depth,
            criterion,
            choose,
            frozenset(config.stop_tokens or ()),
            logits[0],
            state[0],
            sequences.cache,
            0,
            len(request.prompt),
        )

    def _next_token(self, row: _Row) -> str | None:
        """Chooses and sends ``row``'s next token; returns why the row ends, or None if it goes on."""
        if row.request.cancelled:
            return "cancelled"
        token = int(row.choose(row.logits[None])[0])
        steps = row.depth if row.produced == 0 else row.last_steps
        row.request.send(Token(token, steps, *_logprobs(row.logits, token, row.request.logprobs)))
        row.produced += 1
        if token in row.stops:
            return "stop"
        if row.remaining == 0:
            return "length"
        row.pending = token
        return None

    # The batch --------------------------------------------------------------------------------------------------
    def _rebuild(self, rows: list[_Row]) -> None:
        """One cache for ``rows``, each row's positions right-aligned at the longest row's length."""
        self.rows = rows
        if not rows:
            self.cache, self.mask = None, None
            return
        config = self.model.config
        length = max(row.length for row in rows)
        capacity = length + max(row.remaining for row in rows)
        dtype = activation_dtype(self.model.embedding)
        cache = RecurrentKVCache(
            len(rows), config.n_heads, config.head_dim, capacity, self.kv_share, dtype, self.device
        )
        cache.length = length
        keys = {key for row in rows for key in row.source.keys}
        for key in sorted(keys, key=lambda k: (k.part, k.layer, k.slot)):
            for store, target in (("keys", cache.keys), ("values", cache.values)):
                buffer = torch.zeros(cache.shape, dtype=dtype, device=self.device)
                for i, row in enumerate(rows):
                    source = getattr(row.source, store).get(key)
                    if source is not None:  # a slot deeper than this row ever reads stays empty
                        end = row.source.length
                        buffer[i, :, length - row.length : length] = source[
                            row.index, :, end - row.length : end
                        ]
                target[key] = buffer
        mask = torch.zeros(len(rows), length, dtype=torch.long, device=self.device)
        for i, row in enumerate(rows):
            mask[i, length - row.length :] = 1
            row.source, row.index = cache, i
        self.cache, self.mask = cache, mask

    def _criteria(self) -> list[tuple[ExitCriterion, torch.Tensor]]:
        """Each exit criterion in use and the rows using it."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, row in enumerate(self.rows):
            if row.criterion is not None:
                groups.setdefault(row.spec, []).append(i)
        found = []
        for spec, indices in groups.items():
            if spec not in self.criteria:
                row = self.rows[indices[0]]
                criterion = ExitCriterion(row.criterion.name, row.criterion.threshold)
                criterion.bind(self.model)
                self.criteria[spec] = criterion
            criterion = self.criteria[spec]
            criterion.reset()
            found.append((criterion, torch.tensor(indices, device=self.device)))
        return found

    def _initial_states(self, embeds: torch.Tensor) -> torch.Tensor:
        """Each row's first state: the previous token's (continuous thought), else drawn at its init scale."""
        rows, model = self.rows, self.model
        states = torch.empty_like(embeds)
        scales: dict[float, list[int]] = {}
        for i, row in enumerate(rows):
            if row.request.config.continuous:
                states[i] = row.state
            else:
                scales.setdefault(row.request.config.init_scale, []).append(i)
        for scale, indices in scales.items():
            index = torch.tensor(indices, device=self.device)
            states[index] = model.initialize_state(embeds[index], scale)
        return states

    @torch.inference_mode()
    def _decode(self) -> None:
        """Every row's pending token through prelude, core (each row to its depth or exit) and coda."""
        model, rows, cache = self.model, self.rows, self.cache
        tokens = torch.tensor([row.pending for row in rows], device=self.device)
        self.mask = torch.cat([self.mask, torch.ones_like(tokens)[:, None]], dim=1)
        ctx = model.context(1, self.mask, cache=cache)
        embeds = model.embed(tokens[:, None], ctx)
        state = self._initial_states(embeds)
        depths = torch.tensor([row.depth for row in rows], device=self.device)
        deepest = int(depths.max())
        cache.ensure_slots(model.config.n_layers_in_recurrent_block, deepest)
        groups = self._criteria()
        needs_logits = any(criterion.needs_logits for criterion, _ in groups)
        every_step = torch.tensor(
            [row.criterion is not None and row.criterion.computes_every_step for row in rows],
            device=self.device,
        )
        active = torch.ones(len(rows), dtype=torch.bool, device=self.device)  # rows still running the core
        reading = active.clone()  # rows whose token is read from a later step than the last
        chosen = state
        used = depths.clone()
        for i in range(deepest):
            if bool(active.all()):
                state = model.core_step(state, embeds, ctx, i)
            else:  # only the rows still running: the others' work is saved, not masked
                index = active.nonzero().squeeze(1)
                step = model.core_step(state[index], embeds[index], _rows_of(ctx, index), i)
                state = state.index_copy(0, index, step)
            last = depths == i + 1
            exited = torch.zeros_like(active)
            if groups and i < deepest - 1:
                ctx.rows = None if bool(active.all()) else active
                logits = model.predict(state, ctx) if needs_logits else None
                for criterion, index in groups:
                    step_logits = None if logits is None else logits[index]
                    exited[index] = criterion.check(state[index], step_logits)
            exited &= reading & ~last
            closing = (last | exited) & reading
            chosen = torch.where(closing[:, None, None], state, chosen)
            reading &= ~closing
            skipped = exited & ~every_step
            if bool(skipped.any()):
                used[skipped] = i + 1
                # Later tokens attend to every iteration's slot: an exited row offers its deepest one there.
                cache.fill_skipped(skipped, cache.length, i + 1)
            active &= ~(skipped | last)
            if not bool(active.any()):
                break
        ctx.rows = None
        logits = model.predict(chosen, ctx)[:, -1]
        cache.advance(1)
        for i, row in enumerate(rows):
            row.logits, row.state, row.length = logits[i], chosen[i], row.length + 1
            row.last_steps = int(used[i])


def _rows_of(ctx: StepContext, index: torch.Tensor) -> StepContext:
    """``ctx`` for the rows ``index`` of the batch alone: their positions, mask and cache rows."""
    rope = ctx.rope[index] if ctx.rope.shape[0] > 1 else ctx.rope
    mask = None if ctx.mask is None else ctx.mask[index]
    return dataclasses.replace(ctx, rope=rope, mask=mask, cache=_CacheRows(ctx.cache, index), rows=None)


class _CacheRows:
    """Some rows of a :class:`RecurrentKVCache`: a step of those rows alone writes their keys and values there
    and attends to theirs."""

    def __init__(self, cache: RecurrentKVCache, index: torch.Tensor) -> None:
        self.cache, self.index = cache, index

    def slot(self, iteration: int) -> int:
        return self.cache.slot(iteration)

    def hook(self, key: LayerKey, start: int, rows: torch.Tensor | None = None) -> KVHook:
        keys, values = self.cache.keys[key], self.cache.values[key]
        index = self.index

        def update(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            end = start + k.shape[2]
            keys[index, :, start:end] = k.to(keys.dtype)
            values[index, :, start:end] = v.to(values.dtype)
            return keys[index, :, :end], values[index, :, :end]

        return update


def _logprobs(logits: torch.Tensor, token: int, top: int | None) -> tuple[float | None, tuple]:
    """The chosen token's log-probability and the ``top`` most likely (id, log-probability), if asked."""
    if top is None:
        return None, ()
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(min(top, logprobs.shape[-1])) if top else (logprobs[:0], logprobs[:0])
    return float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist(), strict=True))
