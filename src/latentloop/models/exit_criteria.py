"""Per-token adaptive exit: after each core iteration of a new token, a criterion says which rows have
converged, and those rows stop iterating on that token.

A spec names a criterion and optionally its threshold: ``"kl:5e-4"``, ``"cosine"`` (its default threshold),
``"none"``. Each criterion is a small class registered under its spec name; adding one is a subclass and a
decorator::

    @register_exit_criterion("halt")
    class Halt(ExitCriterion):
        default = 0.5  # the threshold of a spec without one
        needs_logits = False  # whether check() reads the coda's logits (a coda pass per iteration)

        def check(self, state, logits):
            ...  # [B] bool: the rows that may stop after this iteration
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar, TypeVar

import torch
import torch.nn.functional as F

from latentloop.errors import UsageError
from latentloop.models.looped import LoopedLM

Criterion = TypeVar("Criterion", bound="type[ExitCriterion]")

# Spec name -> criterion class; filled by register_exit_criterion.
CRITERIA: dict[str, type[ExitCriterion]] = {}


def register_exit_criterion(name: str) -> Callable[[Criterion], Criterion]:
    """Class decorator: ``cls`` becomes the criterion of the specs ``name`` and ``name:threshold``."""

    def register(cls: Criterion) -> Criterion:
        if not name or ":" in name or name == "none" or name in CRITERIA:
            raise ValueError(f"exit criterion name {name!r} is empty, taken or holds ':'")
        cls.name = name
        CRITERIA[name] = cls
        return cls

    return register


class _Summary(Mapping[str, tuple[float, bool]]):
    """Spec name -> (default threshold, whether it reads logits) of every registered criterion."""

    def __getitem__(self, name: str) -> tuple[float, bool]:
        cls = CRITERIA[name]
        return cls.default, cls.needs_logits

    def __iter__(self) -> Iterator[str]:
        return iter(CRITERIA)

    def __len__(self) -> int:
        return len(CRITERIA)


EXIT_CRITERIA: Mapping[str, tuple[float, bool]] = _Summary()


class ExitCriterion:
    """Decides, after each core iteration, which rows have converged (judged at the last position).

    ``ExitCriterion(name, threshold)`` builds the criterion registered as ``name``; a ``threshold`` of None
    takes its default. One instance follows one token's iterations; :meth:`reset` starts the next token.
    """

    name: ClassVar[str]
    default: ClassVar[float]
    needs_logits: ClassVar[bool]
    # Whether the prompt's last position exits too (the prefill runs at full depth for the cache, and the first
    # new token is read from the step this criterion picks); a criterion that mirrors a model's own inference
    # rule, as the exit gate does, sets it.
    at_prefill: ClassVar[bool] = False
    # Whether the iterations after a row's exit are still computed, the exit choosing only the iteration its
    # output is read from (the reference's inference with an exit gate): later tokens then attend to the same
    # cache as in the reference. Sequential decoding runs them later, with the tokens that attend to them.
    computes_every_step: ClassVar[bool] = False

    def __new__(cls, name: str, threshold: float | None = None) -> ExitCriterion:
        # Building the base class by name gives the registered subclass, so callers only need the spec.
        registered = CRITERIA.get(name)
        if registered is None or not issubclass(registered, cls):
            raise UsageError(f"unknown exit criterion {name!r} (known: {', '.join(CRITERIA)})")
        return super().__new__(registered)

    def __init__(self, name: str, threshold: float | None = None) -> None:
        self.threshold = float(self.default if threshold is None else threshold)
        if self.threshold < 0:
            raise UsageError(f"exit threshold must not be negative, got {self.threshold}")
        self.reset()

    def __getnewargs__(self) -> tuple[str, float]:
        return self.name, self.threshold  # copy and pickle rebuild through __new__, which needs the name

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

    def bind(self, model: LoopedLM) -> None:
        """Called once per generation with the model; a criterion that reads the model's own parts (an exit
        gate) keeps them here, or refuses a model that lacks them with a :class:`UsageError`."""

    def reset(self) -> None:
        """Forget the iterations seen so far: the next call of :meth:`check` is a new token's first."""

    def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        """Rows ([B] bool) that meet the criterion after this iteration. ``state`` [B, T, h]; ``logits``
        [B, T, V], or None when the criterion does not read them."""
        raise NotImplementedError


class SuccessiveIterations(ExitCriterion):
    """A row converges once a distance between this iteration and the one before falls below the threshold.
    The distance compares next-token log-probabilities when ``needs_logits``, else latent states."""

    def reset(self) -> None:
        self.previous: torch.Tensor | None = None

    def distance(self, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """[B] distances between [B, h] states or [B, V] log-probabilities."""
        raise NotImplementedError

    def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        current = F.log_softmax(logits[:, -1].float(), dim=-1) if self.needs_logits else state[:, -1].float()
        previous, self.previous = self.previous, current
        if previous is None:
            return torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
        return self.distance(current, previous) < self.threshold


@register_exit_criterion("kl")
class KLDivergence(SuccessiveIterations):
    """KL(p_i || p_{i-1}) of successive next-token distributions."""

    default, needs_logits = 5e-4, True

    def distance(self, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return (current.exp() * (current - previous)).sum(-1)


@register_exit_criterion("entropy-diff")
class EntropyChange(SuccessiveIterations):
    """|H_i - H_{i-1}|: the next-token distribution's entropy has stopped moving."""

    default, needs_logits = 1e-3, True

    def distance(self, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return ((current.exp() * current).sum(-1) - (previous.exp() * previous).sum(-1)).abs()


@register_exit_criterion("latent-diff")
class LatentChange(SuccessiveIterations):
    """||s_i - s_{i-1}|| / ||s_i||: the relative step of the latent state."""

    default, needs_logits = 0.03, False

    def distance(self, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return (current - previous).norm(dim=-1) / current.norm(dim=-1).clamp_min(1e-12)


@register_exit_criterion("cosine")
class CosineDistance(SuccessiveIterations):
    """1 - cos(s_i, s_{i-1}): the latent state has stopped turning."""

    default, needs_logits = 1e-3, False

    def distance(self, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return 1 - F.cosine_similarity(current, previous, dim=-1)


@register_exit_criterion("argmax-stability")
class ArgmaxStability(ExitCriterion):
    """The most likely next token has stayed the same for ``threshold`` iterations in a row."""

    default, needs_logits = 5, True

    def __init__(self, name: str, threshold: float | None = None) -> None:
        super().__init__(name, threshold)
        if self.threshold < 1 or not self.threshold.is_integer():
            raise UsageError(f"argmax-stability needs a whole number of steps >= 1, got {self.threshold}")

    def reset(self) -> None:
        self.previous: torch.Tensor | None = None
        self.stable: torch.Tensor | None = None  # per row: iterations the argmax has not changed

    def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        current = logits[:, -1].argmax(-1)
        previous, self.previous = self.previous, current
        if previous is None:
            self.stable = torch.zeros_like(current)
            return torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
        self.stable = torch.where(current == previous, self.stable + 1, torch.zeros_like(self.stable))
        return self.stable >= self.threshold


@register_exit_criterion("gate")
class ExitGate(ExitCriterion):
    """The model's learned exit gate (Ouro): with ``λ_t`` the gate's exit probability after step t, a row exits
    once the cumulative exit probability ``Σ_{s<=t} λ_s Π_{r<s}(1 - λ_r)`` reaches the threshold, the rule of the
    reference's ``early_exit_threshold``. A spec without a threshold takes the model config's
    ``early_exit_threshold``. Unlike the reference, which computes every step and selects one afterwards, the
    steps after the exit are not computed."""

    default, needs_logits, at_prefill = float("nan"), False, True

    def __init__(self, name: str, threshold: float | None = None) -> None:
        self.threshold = float("nan") if threshold is None else float(threshold)
        if not (self.threshold != self.threshold or 0 < self.threshold <= 1):  # nan: the model's own, on bind
            raise UsageError(f"gate threshold must be in (0, 1], got {self.threshold}")
        self.exit_lambda: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.reset()

    def bind(self, model: LoopedLM) -> None:
        if not model.loop.exit_gate:
            raise UsageError("exit criterion 'gate' needs a model with an exit gate (an Ouro model)")
        self.exit_lambda = model.exit_lambda  # type: ignore[attr-defined]
        if self.threshold != self.threshold:
            own = getattr(model.config, "early_exit_threshold", None)
            self.threshold = 1.0 if own is None else float(own)

    def reset(self) -> None:
        self.remaining: torch.Tensor | None = None  # per row: probability of not having exited yet
        self.cumulative: torch.Tensor | None = None

    def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        if self.exit_lambda is None:
            raise UsageError("exit criterion 'gate' was not bound to a model")
        lam = self.exit_lambda(state[:, -1])
        if self.remaining is None:
            self.remaining, self.cumulative = torch.ones_like(lam), torch.zeros_like(lam)
        # Summed step by step, as the reference's cumsum of the exit distribution is.
        self.cumulative = self.cumulative + lam * self.remaining
        self.remaining = self.remaining * (1 - lam)
        return self.cumulative >= self.threshold


@register_exit_criterion("gate-full")
class ExitGateFull(ExitGate):
    """The exit gate as the reference runs it: every step is computed for every token, and each token is read
    from the step where its cumulative exit probability reaches the threshold. The same tokens as the reference;
    eager sequential decoding chooses each token at its exit and runs its later steps in the next tokens'
    passes, once one of them needs them (:class:`~latentloop.models.decoding.SequentialDecoding`), so a
    token waits only for its exit.
    ``gate`` skips the steps after the exit instead, so later tokens attend to a cache without them and may
    differ."""

    computes_every_step = True
