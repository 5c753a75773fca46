"""Test-time scaling of reasoners in depth (supervision steps, optional halting) and width (parallel samples).

``solve`` repeats the batch K times (sample-major: row ``k * B + b`` is sample ``k`` of puzzle ``b``), so each
step costs one batched forward. Every step's decoded tokens, values and halting probabilities are kept, so
accuracy curves over steps and over samples come from one run. Deterministic models give K identical
samples; GRAM's samples differ because each draws its own noise from the prior.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from latentloop.errors import UsageError
from latentloop.models.reasoners.base import Reasoner

SELECTIONS = ("vote", "value", "first")


@dataclass
class SolveResult:
    """Per-step, per-sample record of a :func:`solve` call."""

    predictions: torch.Tensor  # [S, K, B, L] argmax tokens after each step (frozen after a sample halts)
    values: torch.Tensor  # [S, K, B] value head
    halt_prob: torch.Tensor  # [S, K, B] sigmoid(q_halt)
    halted_at: torch.Tensor  # [K, B] the step (1-based) whose answer a sample keeps; S when it never halted
    chosen_sample: torch.Tensor  # [B] the sample ``select`` picked at the last step
    chosen: torch.Tensor  # [B, L] its tokens


def select_sample(keys: Sequence[Hashable], values: Sequence[float] | None, mode: str) -> int:
    """The index of the chosen sample among one puzzle's samples.

    ``vote``: the most frequent answer key (ties go to the answer seen first); ``value``: the highest value;
    ``first``: sample 0.
    """
    if mode not in SELECTIONS:
        raise UsageError(f"select must be one of {', '.join(SELECTIONS)}, got {mode!r}")
    if not keys:
        raise ValueError("no samples to select from")
    if mode == "first":
        return 0
    if mode == "value":
        if values is None:
            raise ValueError("value selection needs values")
        return max(range(len(keys)), key=lambda i: (values[i], -i))
    counts = Counter(keys)
    best = max(counts.values())
    return next(i for i, key in enumerate(keys) if counts[key] == best)


def _token_key(tokens: torch.Tensor) -> bytes:
    return tokens.cpu().numpy().tobytes()


def draws_samples(model: Reasoner) -> bool:
    """Whether ``model``'s trajectories differ from one another: AR and MDLM draw tokens, GRAM its noise; the
    deterministic reasoners give every trajectory the same answer."""
    return model.generative or model.stochastic


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
    """
    if select not in SELECTIONS:
        raise UsageError(f"--select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    sampler = model.sample if model.generative else None  # type: ignore[attr-defined]
    steps = model.config.n_sup if steps is None and sampler is None else steps
    if (steps is not None and steps < 1) or samples < 1:
        raise UsageError(f"steps and samples must be at least 1, got {steps} and {samples}")
    if not temperature >= 0:
        raise UsageError(f"--temperature must be at least 0, got {temperature}")
    if x.dim() != 2 or x.shape[1] != model.config.seq_len:
        raise UsageError(f"puzzles must be [batch, {model.config.seq_len}] tokens, got {list(x.shape)}")
    was_training = model.training
    model.eval()
    q_learning = model.config.halting == "q-learning"
    batch_size = x.shape[0]
    # A deterministic reasoner gives every trajectory the same answer: run one and repeat it.
    runs = samples if draws_samples(model) else 1
    batch = {"inputs": x.repeat(runs, 1)}
    if puzzle_ids is not None:
        batch["puzzle_ids"] = puzzle_ids.to(x.device).repeat(runs)
    preds, values, halts = [], [], []
    if sampler is not None:  # every step's prediction at once; the loop below then has nothing left to run
        tokens, sampled = sampler(batch["inputs"], steps=steps, temperature=temperature)
        preds, values, halts = list(tokens), list(sampled.float()), [torch.zeros_like(v) for v in sampled]
        steps = len(preds)
    noise = {"temperature": temperature} if model.stochastic and sampler is None else {}
    carry = model.initial_carry(batch)
    done = torch.zeros(runs * batch_size, dtype=torch.bool, device=x.device)
    halted_at = torch.full((runs * batch_size,), steps, dtype=torch.long, device=x.device)
    for step in range(len(preds), steps):
        carry, out = model(carry, batch, **noise)
        tokens = out.logits.argmax(-1)
        value, halt_prob = out.value.float(), torch.sigmoid(out.halt_logit.float())
        if preds:  # halted samples keep the answer (and value) of the step they halted at
            tokens = torch.where(done[:, None], preds[-1], tokens)
            value = torch.where(done, values[-1], value)
        preds.append(tokens)
        values.append(value)
        halts.append(halt_prob)
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
                break
    model.train(was_training)
    shape = (samples, batch_size)
    predictions = torch.stack(preds).view(steps, runs, batch_size, -1).expand(steps, *shape, -1)
    value_t = torch.stack(values).view(steps, runs, batch_size).expand(steps, *shape)
    key_fn = key or _token_key
    chosen_index = []
    for b in range(batch_size):
        keys = [key_fn(predictions[-1, k, b]) for k in range(samples)]
        chosen_index.append(select_sample(keys, value_t[-1, :, b].tolist(), select))
    chosen_sample = torch.tensor(chosen_index, dtype=torch.long)
    return SolveResult(
        predictions=predictions,
        values=value_t,
        halt_prob=torch.stack(halts).view(steps, runs, batch_size).expand(steps, *shape),
        halted_at=halted_at.view(runs, batch_size).expand(shape),
        chosen_sample=chosen_sample,
        chosen=predictions[-1, chosen_sample, torch.arange(batch_size)],
    )
