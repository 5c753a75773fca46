"""Generation for the recurrent-depth LM: any depth, KV cache (optionally shared across iterations),
per-token adaptive exit, continuous chain of thought, self-speculative decoding, the parallel sampler,
left-padded batches, and width in latent space (K trajectories per prompt from random initial states, answer
by majority vote).

:class:`GenerationConfig` holds the settings and checks them when built; :func:`generate` picks the decoding
strategy they ask for (:mod:`latentloop.models.decoding`) and runs it. Exit criteria live in
:mod:`latentloop.models.exit_criteria`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import torch

from latentloop.config import option
from latentloop.errors import UsageError
from latentloop.models.decoding import GenerationOutput, decoding_strategy
from latentloop.models.exit_criteria import EXIT_CRITERIA, ExitCriterion, register_exit_criterion
from latentloop.models.parallel_sampler import ParallelSampler
from latentloop.nn.packed import prepacked
from latentloop.nn.quantized import check_weight_format, is_quantized, quantize_weights
from latentloop.nn.screened import screened_argmax

if TYPE_CHECKING:  # annotations only: recurrent_depth imports this module for RecurrentDepthLM.generate
    from latentloop.models.looped import LoopedLM

__all__ = [
    "EXIT_CRITERIA",
    "ExitCriterion",
    "GenerationConfig",
    "GenerationOutput",
    "generate",
    "register_exit_criterion",
    "select_token",
    "vote_continuations",
]

# Settings only sequential decoding reads; the parallel sampler refuses any other than its default.
_SEQUENTIAL_ONLY = (
    "exit",
    "continuous",
    "speculative",
    "kv_share",
    "return_trajectory",
    "use_cache",
    "compile",
    "return_logits",
    "screen_head",
)


@dataclass(frozen=True)
class GenerationConfig:
    """How :func:`generate` continues a prompt. Building one checks every field; a bad value raises a
    :class:`~latentloop.errors.UsageError` that names it.

    ``num_steps`` core iterations per token (None: the model's ``mean_recurrence``), each token from a random
    initial state of scale ``init_scale`` (0: zeros). Tokens are greedy unless ``do_sample``, then drawn after
    ``temperature``, ``top_k`` and ``top_p`` filtering. A row ends at any of ``stop_tokens`` and is padded
    with ``pad_token_id`` while other rows go on.

    Sequential decoding: ``kv_share=k`` keeps k core cache slots (iteration i uses slot i mod k). ``exit``
    (e.g. ``"kl:5e-4"``) stops each token's iterations once the criterion holds. ``continuous`` starts each
    token from the previous token's final state. ``use_cache=False`` recomputes the whole sequence for every
    token (a reference for testing). ``compile`` runs each new token's prelude, core iterations and coda as
    compiled graphs; the first call of a size pays the compilation. ``prepack`` decodes through a copy of the
    model whose linear weights are repacked for oneDNN's CPU kernels (:func:`latentloop.nn.packed.prepacked`):
    faster eager decoding on a CPU (docs/lm.md measures it level with ``compile``), at the memory of a second
    copy of those weights during the call, and with sums in another order (the last bits of the logits
    differ). ``weights="int8"`` decodes through a copy of the model whose linear and embedding weights are int8
    with one scale per output row (:func:`quantized_copy`): a quarter of fp32's bytes read per weight, where a
    looped LM's decoding is bound by memory bandwidth (docs/lm.md measures its speed and drift). ``screen_head``
    chooses each greedy token from an fp16 copy of the output layer, computing in fp32
    only the logits that can still be the largest (:class:`latentloop.nn.screened.ScreenedArgmax`): the tokens of
    the full fp32 product (two logits equal to fp32's last bits may order either way, as between any two
    kernels), at half the bytes of the largest weight read per token. It needs greedy decoding and no
    ``return_logits``; at each batch size it is used only where a timing on the first token finds it faster than
    the full product (on CPUs without fast fp16 kernels, at one row but not at eight; docs/lm.md).
    ``return_trajectory`` keeps the state after every iteration, ``return_logits`` the logits of every chosen
    token.

    Other strategies: ``speculative=d`` drafts ``draft_tokens`` tokens at depth d and verifies them in one
    full-depth pass. ``sampler="parallel"`` (or a :class:`~latentloop.models.parallel_sampler.ParallelSampler`
    with its knobs) decodes a wavefront of positions at once. ``num_samples=K`` runs K latent trajectories of
    every prompt as one batch, each from its own random initial state (``init_scale > 0``), and returns the
    continuation most of them agree on (ties go to the earliest trajectory); see :func:`vote_continuations`.
    """

    # The fields with a help text are the options of `latentloop generate` (latentloop.cli.options).
    max_new_tokens: int = option(32, "Tokens to generate at most.", "-n")
    num_steps: int | None = option(None, "Core iterations per token (default: the model's mean).", "-r")
    init_scale: float = option(1.0, "Scale of the random initial state (0 = zeros).")
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = option(None, "Sample only among the k most likely tokens.")
    top_p: float | None = option(None, "Sample only within this probability mass.")
    stop_tokens: tuple[int, ...] | None = None
    pad_token_id: int = 0
    kv_share: int | None = option(None, "Core KV-cache slots (iteration i uses slot i mod k).")
    exit: str | ExitCriterion | None = option(  # noqa: RUF009 - a field, not a shared default
        None,
        "Per-token early exit, e.g. kl:5e-4, entropy-diff:1e-3, latent-diff:0.03, cosine; Ouro: gate:0.9 "
        "(skips the steps after the exit) or gate-full:0.9 (computes them, as the official code, after the "
        "token is chosen).",
    )
    continuous: bool = option(False, "Warm-start each token from the previous state.")
    use_cache: bool = True
    compile: bool = option(
        False,
        "Run each token's prelude, core iterations and coda as torch.compile graphs: faster decoding after a "
        "compilation of some seconds (counted in --json's tokens/s).",
    )
    prepack: bool = option(
        False,
        "Decode through a copy of the model with its linear weights repacked for oneDNN's CPU kernels: faster "
        "eager decoding, at a second copy of those weights.",
    )
    weights: str | None = option(
        None,
        "Decode with the linear and embedding weights in this format: int8 (one scale per output row; a copy, "
        "kept while the model's weights stay the same). Default: the model's own.",
    )
    screen_head: bool = option(
        False,
        "Greedy only: choose each token from an fp16 copy of the output layer, computing in fp32 only the "
        "logits that can be the largest. The same tokens, reading half the bytes of the largest weight.",
    )
    return_trajectory: bool = False
    return_logits: bool = False
    speculative: int | None = option(None, "Draft with this many iterations, verify at full depth.")
    draft_tokens: int = option(4, "Tokens drafted per speculative round.")
    sampler: str | ParallelSampler = option(  # noqa: RUF009 - a field, not a shared default
        "sequential", "sequential, or parallel: a wavefront of positions decoded at once (diffusion-style)."
    )
    num_samples: int = option(
        1,
        "Latent trajectories of the prompt (each from its own random initial state); the answer most agree on.",
    )

    def __post_init__(self) -> None:
        _whole("max_new_tokens", self.max_new_tokens, 0)
        _whole("num_steps", self.num_steps, 1, optional=True)
        _not_negative("init_scale", self.init_scale)
        _not_negative("temperature", self.temperature)
        _whole("top_k", self.top_k, 0, optional=True)
        if self.top_p is not None and not (isinstance(self.top_p, Real) and 0 < self.top_p <= 1):
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.stop_tokens is not None:
            if isinstance(self.stop_tokens, (str, bytes)) or not all(
                isinstance(t, Integral) for t in self.stop_tokens
            ):
                raise UsageError(f"stop_tokens must be token ids, got {self.stop_tokens!r}")
            object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
        _whole("pad_token_id", self.pad_token_id, None)
        _whole("kv_share", self.kv_share, 1, optional=True)
        if self.criterion() is None:  # a bad spec fails in parse; "none" reads as no exit
            object.__setattr__(self, "exit", None)
        for name in (
            "do_sample",
            "continuous",
            "use_cache",
            "compile",
            "prepack",
            "screen_head",
            "return_trajectory",
            "return_logits",
        ):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _whole("speculative", self.speculative, 1, optional=True)
        _whole("draft_tokens", self.draft_tokens, 1)
        if not isinstance(self.sampler, ParallelSampler) and self.sampler not in ("sequential", "parallel"):
            raise UsageError(f"unknown sampler {self.sampler!r} (sequential or parallel)")
        _whole("num_samples", self.num_samples, 1)
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Settings that are fine alone but not together."""
        if self.num_samples > 1:
            if self.init_scale <= 0:
                raise UsageError(
                    "num_samples > 1 needs init_scale > 0: trajectories from the zero state are all the same"
                )
            if self.speculative is not None or self.parallel is not None or self.return_logits:
                raise UsageError(
                    "speculative decoding, the parallel sampler and return_logits take num_samples=1"
                )
        if self.parallel is not None:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            changed = [name for name in _SEQUENTIAL_ONLY if getattr(self, name) != defaults[name]]
            if changed:
                raise UsageError(f"the parallel sampler does not combine with {', '.join(changed)}")
        if self.speculative is not None and (self.exit is not None or self.continuous or not self.use_cache):
            raise UsageError(
                "speculative decoding cannot be combined with adaptive exit, continuous mode or no cache"
            )
        if not self.use_cache and (
            self.exit is not None or self.continuous or self.kv_share is not None or self.compile
        ):
            raise UsageError("adaptive exit, continuous mode, kv_share and compile need the KV cache")
        if self.speculative is not None and (self.compile or self.return_logits):
            raise UsageError("speculative decoding does not combine with compile or return_logits")
        if self.screen_head and (self.do_sample or self.return_logits or self.speculative is not None):
            # Only the largest logit is computed exactly; sampling and returned logits need them all.
            raise UsageError(
                "screen_head gives greedy tokens only: it does not combine with do_sample, return_logits or "
                "speculative decoding"
            )
        check_weight_format(self.weights)
        if self.weights is not None and (self.prepack or self.screen_head):
            # Both read the float weights that quantization replaces.
            raise UsageError("weights does not combine with prepack or screen_head")
        if self.prepack and self.compile:
            # A compiled graph cannot take oneDNN's opaque packed weights as inputs.
            raise UsageError("prepack and compile do not combine: choose one")

    @property
    def parallel(self) -> ParallelSampler | None:
        """The parallel sampler's settings, or None for the other strategies."""
        if isinstance(self.sampler, ParallelSampler):
            return self.sampler
        return ParallelSampler() if self.sampler == "parallel" else None

    def criterion(self) -> ExitCriterion | None:
        """The exit criterion of ``exit`` (a fresh one for a spec), or None."""
        return ExitCriterion.parse(self.exit)

    def depth(self, model: LoopedLM) -> int:
        """Core iterations per token: ``num_steps``, else the model's mean recurrence."""
        depth = int(self.num_steps if self.num_steps is not None else model.config.mean_recurrence)
        if depth < 1:
            raise UsageError(f"num_steps must be at least 1, got {depth}")
        return depth


def _whole(name: str, value: object, least: int | None, optional: bool = False) -> None:
    """Refuses ``value`` unless it is a whole number of at least ``least`` (None where ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or (least is not None and value < least):
        bound = "" if least is None else f" of at least {least}"
        raise UsageError(f"{name} must be a whole number{bound}, got {value!r}")


def _not_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0:
        raise UsageError(f"{name} must be a number >= 0, got {value!r}")


def generate(
    model: LoopedLM,
    input_ids: torch.Tensor,
    config: GenerationConfig | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    **settings: Any,
) -> GenerationOutput:
    """Continue ``input_ids`` [B, T0] as ``config`` says, or as keyword settings say (the fields of
    :class:`GenerationConfig`, e.g. ``max_new_tokens=16, num_steps=8, exit="kl:5e-4"``). Keywords next to a
    config may only repeat its values.

    ``attention_mask`` (1 = token, 0 = left padding) makes padded batches exact; ``generator`` draws the
    sampled tokens (the initial states come from torch's global generator).
    """
    config = _settle(config, settings)
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise UsageError("the prompt is empty: give at least one token")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise UsageError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from input {tuple(input_ids.shape)}"
        )
    if config.weights is not None:
        model = quantized_copy(model, config.weights)
    check_loop(model, config)
    if config.num_samples > 1:
        return _vote(model, input_ids, config, attention_mask, generator)
    depth = config.depth(model)
    strategy = decoding_strategy(config)
    strategy.check(input_ids, attention_mask, depth)
    total = strategy.capacity(input_ids)
    if total > model.config.block_size:
        raise UsageError(f"prompt plus new tokens ({total}) exceed block_size {model.config.block_size}")
    choose = functools.partial(
        select_token,
        do_sample=config.do_sample,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        generator=generator,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            # The packed copy lives only as long as the call, and packing counts in its time.
            decoder = prepacked(model, input_ids.shape[0]) if config.prepack else model
            screen = screened_argmax(model.lm_head.weight) if config.screen_head else None
            out = strategy.decode(decoder, input_ids, attention_mask, depth, choose, screen)
            out.seconds = time.perf_counter() - started
    finally:
        model.train(was_training)
    return _plain(out)


_QUANTIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def quantized_copy(model: LoopedLM, weights: str) -> LoopedLM:
    """``model`` with its weights in ``weights`` format (:func:`latentloop.nn.quantized.quantize_weights`); a
    model already quantized is returned as it is. The copy is kept with the model and made again once one of
    the model's weights changes (a training step)."""
    if is_quantized(model):
        return model
    stamp = tuple((id(p), p._version) for p in model.parameters())
    kept = _QUANTIZED.get(model)
    if kept is None or kept[0] != (weights, stamp):
        kept = ((weights, stamp), quantize_weights(model, weights).eval())
        _QUANTIZED[model] = kept
    return kept[1]


def check_loop(model: LoopedLM, config: GenerationConfig) -> None:
    """Refuses settings whose assumptions the model's loop (``model.loop``) breaks."""
    loop = model.loop
    if not loop.input_injection and (config.continuous or config.parallel is not None):
        # Both replace or revise a position's input while its state is in flight; a loop that reads the token
        # only through its initial state would never see the new token.
        raise UsageError(
            "continuous mode and the parallel sampler need a model that injects its input at every step"
        )
    if config.num_samples > 1 and not loop.random_initial_state:
        raise UsageError("num_samples > 1 needs a model whose loop starts from a random state")


def _settle(config: GenerationConfig | None, settings: dict[str, Any]) -> GenerationConfig:
    """The config of a call: ``config``, or one built from the keyword settings."""
    known = {f.name for f in dataclasses.fields(GenerationConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s): {', '.join(unknown)}")
    if config is None:
        return GenerationConfig(**settings)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"generate() takes a GenerationConfig after the prompt, got {type(config).__name__}")
    asked = dataclasses.replace(config, **settings)
    conflicts = [name for name in settings if getattr(asked, name) != getattr(config, name)]
    if conflicts:
        raise UsageError(f"keyword(s) {', '.join(conflicts)} differ from the GenerationConfig given")
    return config


def _vote(
    model: LoopedLM,
    input_ids: torch.Tensor,
    config: GenerationConfig,
    attention_mask: torch.Tensor | None,
    generator: torch.Generator | None,
) -> GenerationOutput:
    """Width in latent space: ``num_samples`` trajectories of every prompt as one batch, and the
    continuation most of them agree on."""
    k, batch, width = config.num_samples, input_ids.shape[0], input_ids.shape[1]
    wide = generate(
        model,
        input_ids.repeat_interleave(k, dim=0),
        dataclasses.replace(config, num_samples=1),
        attention_mask=None if attention_mask is None else attention_mask.repeat_interleave(k, 0),
        generator=generator,
    )
    samples = wide.sequences.view(batch, k, -1)
    chosen, votes = vote_continuations(samples[:, :, width:])
    rows = torch.arange(batch, device=samples.device)
    wide.sequences = samples[rows, chosen]
    wide.steps = wide.steps.view(batch, k, -1)[rows.cpu(), chosen.cpu()]
    wide.samples, wide.votes = samples, votes
    return wide


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
