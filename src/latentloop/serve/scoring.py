"""Log-probabilities of a prompt's own tokens under a looped LM at a given depth (OpenAI's ``echo`` with
``logprobs``, which lm-evaluation-harness's loglikelihood requests use)."""

from __future__ import annotations

import torch

from latentloop.models.looped import LoopedLM


@torch.inference_mode()
def prompt_logprobs(
    model: LoopedLM, prompt: list[int], depth: int, init_scale: float, top: int
) -> list[tuple[float | None, tuple[tuple[int, float], ...]]]:
    """For each token of ``prompt``: its log-probability given the tokens before it (None for the first) and
    the ``top`` most likely tokens there, (id, log-probability), from one forward pass at ``depth``."""
    ids = torch.tensor([prompt], device=model.embedding.weight.device)
    logprobs = torch.log_softmax(model(ids, num_steps=depth, init_scale=init_scale).logits[0].float(), dim=-1)
    scored: list[tuple[float | None, tuple[tuple[int, float], ...]]] = [(None, ())]
    for position, token in enumerate(prompt[1:]):
        row = logprobs[position]
        values, ids_ = row.topk(min(max(top, 1), row.shape[-1]))
        scored.append((float(row[token]), tuple(zip(ids_.tolist(), values.tolist(), strict=True))))
    return scored
