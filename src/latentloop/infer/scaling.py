"""Test-time scaling of reasoners in depth (supervision steps, optional halting) and width (parallel samples).

``solve`` repeats the batch K times (sample-major: row ``k * B + b`` is sample ``k`` of puzzle ``b``), so each
step costs one batched forward. Every step's decoded tokens, values and halting probabilities are kept, so
accuracy curves over steps and over samples come from one run. Deterministic models give K identical
samples; GRAM's samples differ because each draws its own noise from the prior, and any reasoner's differ
when ``state_noise`` perturbs its latent state before every supervision step (as PTRM does to TRM).

The inference compute of a (steps, samples) setting is counted from shapes (:func:`step_cost`,
:func:`inference_flops`): the matrix products of one supervision step of one puzzle, times the steps and the
trajectories run, plus the value head once per trajectory where it selects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from latentloop.errors import UsageError
from latentloop.models.reasoners.base import Reasoner
from latentloop.nn.flops import FlopCounter

# q: the sample whose halting head (TRM's Q-head) is most confident that its answer is finished, as PTRM selects
SELECTIONS = ("vote", "value", "first", "q")


@dataclass
class SolveResult:
    """Per-step, per-sample record of a :func:`solve` call."""

    predictions: torch.Tensor  # [S, K, B, L] argmax tokens after each step (frozen after a sample halts)
    values: torch.Tensor  # [S, K, B] value head
    halt_prob: torch.Tensor  # [S, K, B] sigmoid(q_halt)
    halted_at: torch.Tensor  # [K, B] the step (1-based) whose answer a sample keeps; S when it never halted
    chosen_sample: torch.Tensor  # [B] the sample ``select`` picked at the last step
    chosen: torch.Tensor  # [B, L] its tokens
    halt_logits: torch.Tensor | None = None  # [S, K, B] q_halt, what ``select="q"`` ranks by


@dataclass(frozen=True)
class StepCost:
    """Forward FLOPs of one puzzle: one supervision step (the recursion, the decoder and the halting head),
    and the value head read once (see :mod:`latentloop.nn.flops` for what is counted)."""

    step: int
    value_head: int


def select_sample(keys: Sequence[Hashable], values: Sequence[float] | None, mode: str) -> int:
    """The index of the chosen sample among one puzzle's samples.

    ``vote``: the most frequent answer key (ties go to the answer seen first); ``value`` and ``q``: the highest
    of ``values``, which are the value head's for ``value`` and the halting logits for ``q`` (ties go to the
    first); ``first``: sample 0.
    """
    if mode not in SELECTIONS:
        raise UsageError(f"select must be one of {', '.join(SELECTIONS)}, got {mode!r}")
    if not keys:
        raise ValueError("no samples to select from")
    if mode == "first":
        return 0
    if mode in ("value", "q"):
        if values is None:
            raise ValueError(f"{mode} selection needs scores")
        return max(range(len(keys)), key=lambda i: (values[i], -i))
    counts = Counter(keys)
    best = max(counts.values())
    return next(i for i, key in enumerate(keys) if counts[key] == best)


def _token_key(tokens: torch.Tensor) -> bytes:
    return tokens.cpu().numpy().tobytes()


def draws_samples(model: Reasoner, state_noise: float = 0.0) -> bool:
    """Whether ``model``'s trajectories differ from one another: AR and MDLM draw tokens, GRAM its noise, and
    any reasoner whose state is perturbed (``state_noise > 0``); otherwise every trajectory gives the same
    answer."""
    return model.generative or model.stochastic or state_noise > 0


def trajectories(model: Reasoner, samples: int, state_noise: float = 0.0) -> int:
    """How many trajectories :func:`solve` runs for ``samples`` samples: one when they would all agree."""
    return samples if draws_samples(model, state_noise) else 1


@torch.no_grad()
def step_cost(model: Reasoner) -> StepCost | None:
    """What one supervision step of ``model`` costs on one puzzle, counted from the shapes it runs
    (:class:`~latentloop.nn.flops.FlopCounter`); ``None`` for a generative baseline, whose sampler has no
    supervision steps. The RNG state is kept, so counting draws none of an evaluation's noise."""
    if model.generative:
        return None
    device = model.lm_head.weight.device
    batch = {"inputs": torch.zeros(1, model.config.seq_len, dtype=torch.long, device=device)}
    if model.config.puzzles:
        batch["puzzle_ids"] = torch.zeros(1, dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices), FlopCounter(model) as total, FlopCounter(model.value_head) as value:
        model(model.initial_carry(batch), batch)
    model.train(was_training)
    # The halting head computes its two logits with one fused product that the counter's hooks do not see.
    halting = sum(2 * layer.in_features * layer.out_features for layer in _linears(model.halt_head))
    return StepCost(step=total.forward_flops - value.forward_flops + halting, value_head=value.forward_flops)


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [layer for layer in module.modules() if isinstance(layer, nn.Linear)]


def inference_flops(cost: StepCost, steps: int, runs: int, select: str) -> int:
    """Inference FLOPs per puzzle of ``runs`` trajectories (see :func:`trajectories`) of ``steps``
    supervision steps: ``runs · steps · cost.step``, plus ``runs · cost.value_head`` when the value head
    selects (it reads each trajectory's last state once; vote, q and first cost no matrix product)."""
    if select not in SELECTIONS:
        raise UsageError(f"select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    return runs * steps * cost.step + (runs * cost.value_head if select == "value" else 0)


@torch.no_grad()
def solve(
    model: Reasoner,
    x: torch.Tensor,
    steps: int | None = None,
    samples: int = 1,
    select: str = "vote",
    halt: bool = False,
    key: Callable[[torch.Tensor], Hashable] | None = None,
    temperature: float = 1.0,
    puzzle_ids: torch.Tensor | None = None,
    state_noise: float = 0.0,
) -> SolveResult:
    """Run ``samples`` trajectories of ``steps`` supervision steps (default ``model.config.n_sup``) on ``x``
    ``[B, L]`` and choose one answer per puzzle.

    A generative model (``model.generative``: the AR and MDLM baselines) decodes with its own
    ``sample(inputs, steps, temperature)`` loop instead: ``steps`` are then its unmasking steps (MDLM, default
    ``model.config.cycles``) or 1 (AR), ``temperature`` its sampling temperature (0: greedy), and it never
    halts. For a stochastic reasoner (GRAM) ``temperature`` scales the prior noise's standard deviation (0:
    the prior's mean).

    ``halt``: a sample stops (keeps its answer) once ``sigmoid(q_halt) > 0.5``, or, for a model trained with
    ``model.halting=q-learning``, once ``q_halt > q_continue``. ``key`` maps a sample's tokens
    ``[L]`` to the answer it stands for (the task's decoded answer), so votes count equal answers together;
    by default the raw tokens. ``puzzle_ids`` ``[B]`` name each puzzle for a model with puzzle embeddings.

    ``state_noise`` σ > 0 adds ``N(0, σ²)`` noise to every tensor of the carry (TRM: ``y`` and ``z``) before
    each supervision step, so a deterministic model's samples differ too (PTRM's noisy TRM; the states are
    RMS-normalised, so σ is relative to their scale); ``select="q"`` then picks the sample whose halting
    logit is highest at the last step.
    """
    if select not in SELECTIONS:
        raise UsageError(f"--select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    sampler = model.sample if model.generative else None  # type: ignore[attr-defined]
    steps = model.config.n_sup if steps is None and sampler is None else steps
    if (steps is not None and steps < 1) or samples < 1:
        raise UsageError(f"steps and samples must be at least 1, got {steps} and {samples}")
    if not temperature >= 0:
        raise UsageError(f"--temperature must be at least 0, got {temperature}")
    if not state_noise >= 0:
        raise UsageError(f"--state-noise must be at least 0, got {state_noise}")
    if state_noise and sampler is not None:
        raise UsageError(f"--state-noise perturbs a recursion's latent state; {model.arch} decodes tokens")
    if x.dim() != 2 or x.shape[1] != model.config.seq_len:
        raise UsageError(f"puzzles must be [batch, {model.config.seq_len}] tokens, got {list(x.shape)}")
    was_training = model.training
    model.eval()
    q_learning = model.config.halting == "q-learning"
    batch_size = x.shape[0]
    # A deterministic reasoner gives every trajectory the same answer: run one and repeat it.
    runs = trajectories(model, samples, state_noise)
    batch = {"inputs": x.repeat(runs, 1)}
    if puzzle_ids is not None:
        batch["puzzle_ids"] = puzzle_ids.to(x.device).repeat(runs)
    preds, values, halts, halt_logits = [], [], [], []
    if sampler is not None:  # every step's prediction at once; the loop below then has nothing left to run
        tokens, sampled = sampler(batch["inputs"], steps=steps, temperature=temperature)
        preds, values, halts = list(tokens), list(sampled.float()), [torch.zeros_like(v) for v in sampled]
        halt_logits = [torch.zeros_like(v) for v in values]
        steps = len(preds)
    noise = {"temperature": temperature} if model.stochastic and sampler is None else {}
    carry = model.initial_carry(batch)
    done = torch.zeros(runs * batch_size, dtype=torch.bool, device=x.device)
    halted_at = torch.full((runs * batch_size,), steps, dtype=torch.long, device=x.device)
    for step in range(len(preds), steps):
        if state_noise:
            carry = {  # the latent states; bookkeeping a carry may hold (GRAM's reveal steps) stays exact
                name: state + state_noise * torch.randn_like(state) if state.is_floating_point() else state
                for name, state in carry.items()
            }
        carry, out = model(carry, batch, **noise)
        tokens = out.logits.argmax(-1)
        value, halt_prob = out.value.float(), torch.sigmoid(out.halt_logit.float())
        logit = out.halt_logit.float()
        if preds:  # halted samples keep the answer (value, halting logit) of the step they halted at
            tokens = torch.where(done[:, None], preds[-1], tokens)
            value = torch.where(done, values[-1], value)
            logit = torch.where(done, halt_logits[-1], logit)
        preds.append(tokens)
        values.append(value)
        halts.append(halt_prob)
        halt_logits.append(logit)
        if halt:
            stop = out.halt_logit.float() > out.continue_logit.float() if q_learning else halt_prob > 0.5
            newly = ~done & stop
            halted_at[newly] = step + 1
            done |= newly
            if bool(done.all()):  # every sample halted: later steps would repeat the same answers
                for _ in range(step + 1, steps):
                    preds.append(tokens)
                    values.append(value)
                    halts.append(halt_prob)
                    halt_logits.append(halt_logits[-1])
                break
    model.train(was_training)
    shape = (samples, batch_size)
    predictions = torch.stack(preds).view(steps, runs, batch_size, -1).expand(steps, *shape, -1)
    value_t = torch.stack(values).view(steps, runs, batch_size).expand(steps, *shape)
    logit_t = torch.stack(halt_logits).view(steps, runs, batch_size).expand(steps, *shape)
    scores = logit_t if select == "q" else value_t
    key_fn = key or _token_key
    chosen_index = []
    for b in range(batch_size):
        keys = [key_fn(predictions[-1, k, b]) for k in range(samples)]
        chosen_index.append(select_sample(keys, scores[-1, :, b].tolist(), select))
    chosen_sample = torch.tensor(chosen_index, dtype=torch.long)
    return SolveResult(
        predictions=predictions,
        values=value_t,
        halt_prob=torch.stack(halts).view(steps, runs, batch_size).expand(steps, *shape),
        halted_at=halted_at.view(runs, batch_size).expand(shape),
        chosen_sample=chosen_sample,
        chosen=predictions[-1, chosen_sample, torch.arange(batch_size)],
        halt_logits=logit_t,
    )
