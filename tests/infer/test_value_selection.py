"""Value selection with a fitted value head: the head loaded beside a checkpoint ranks the samples, so it (not
the head trained with the model, nor the vote) decides which answer is chosen."""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import save_file

from latentloop.infer.scaling import solve
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.models.reasoners.heads import VALUE_HEAD_FILE, SequenceValueHead

SAMPLES, PUZZLES = 6, 3


def loud_gram():
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=3, seq_len=16, dim=16, n_heads=2, n_layers=1, hidden=32, n_sup=2, cycles=2, inner=1
    )
    model = build_reasoner("gram", config)
    with torch.no_grad():  # prior noise of σ ≈ 5 swamps the state: every sample answers otherwise
        model.prior.proj.bias[config.dim :] = 5.0
    return model.eval()


def fitted_head_file(model, folder) -> tuple[str, np.ndarray]:
    """A fitted head whose value is ``sigmoid(w · mean over positions of RMSNorm(RMSNorm(state)))``: its
    sequence mixer and MLP output nothing, so only the two norms of its block remain. Returns the file and
    ``w``."""
    c = model.config
    head = SequenceValueHead(c.positions, c.dim, c.hidden, c.norm_eps)
    weight = torch.randn(1, c.dim, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        head.block.mix.proj.weight.zero_()
        head.block.mlp.proj.weight.zero_()
        head.proj.weight.copy_(weight)
        head.proj.bias.zero_()
    path = folder / VALUE_HEAD_FILE
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(path))
    return str(path), weight[0].numpy().astype(np.float64)


def values_by_hand(states: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    normed = states.astype(np.float64)
    for _ in range(2):
        normed = normed / np.sqrt((normed**2).mean(-1, keepdims=True) + eps)
    return 1 / (1 + np.exp(-(normed.mean(1) @ weight)))


def most_frequent(samples: torch.Tensor) -> int:
    """The first sample whose answer no other answer outnumbers."""
    answers = [row.numpy().tobytes() for row in samples]
    counts = [answers.count(a) for a in answers]
    return counts.index(max(counts))


def solve_seeded(model, x, select: str):
    """``solve`` from the same noise every time, with the latent of each row at the last step."""
    states = []
    hook = model.register_forward_hook(lambda module, args, output: states.append(output[1].state.detach()))
    torch.manual_seed(1)
    try:
        result = solve(model, x, samples=SAMPLES, select=select)
    finally:
        hook.remove()
    return result, states[-1].numpy()


def test_a_fitted_value_head_changes_the_chosen_answer(tmp_path) -> None:
    model = loud_gram()
    x = torch.randint(1, 3, (PUZZLES, 16), generator=torch.Generator().manual_seed(2))
    trained, _ = solve_seeded(model, x, "value")
    vote, _ = solve_seeded(model, x, "vote")

    file, weight = fitted_head_file(model, tmp_path)
    model.load_fitted_value_head(file)
    fitted, states = solve_seeded(model, x, "value")
    # The noise was the same: the samples' answers did not change, only how they are ranked.
    assert torch.equal(fitted.predictions, trained.predictions)
    answers = fitted.predictions[-1]
    distinct = [len({answers[k, b].numpy().tobytes() for k in range(SAMPLES)}) for b in range(PUZZLES)]
    assert min(distinct) > 1, "the samples must disagree for the choice to matter"

    # Rows are sample-major (row k * B + b is sample k of puzzle b).
    expected_values = values_by_hand(states, weight, model.config.norm_eps).reshape(SAMPLES, PUZZLES)
    np.testing.assert_allclose(fitted.values[-1].numpy(), expected_values, rtol=1e-5)
    expected_choice = expected_values.argmax(0)
    assert fitted.chosen_sample.tolist() == expected_choice.tolist()
    assert torch.equal(fitted.chosen, answers[fitted.chosen_sample, torch.arange(PUZZLES)])
    # The vote takes the most frequent answer (the first of them on a tie); the fitted head picks other
    # samples, and none of the ones the trained head picked.
    assert vote.chosen_sample.tolist() == [most_frequent(answers[:, b]) for b in range(PUZZLES)]
    assert (fitted.chosen_sample != vote.chosen_sample).all()
    assert (fitted.chosen_sample != trained.chosen_sample).all()
