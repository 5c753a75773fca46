"""latentloop's Ouro against numbers the official ``modeling_ouro.py`` computed on a tiny random model.

The fixture (``tests/fixtures/ouro_tiny``) was written once by ``benchmarks/compare_ouro_reference.py --fixture``:
the model in the official layout and, at every depth 1..8 on a left-padded batch, the official logits, per-step
hidden states, exit-gate probabilities, logits at two exit thresholds and greedy generations with the cache,
without the exit gate and with it at both thresholds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from latentloop.models.generation import generate
from latentloop.models.ouro import OuroLM

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ouro_tiny"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model() -> OuroLM:
    return OuroLM.from_pretrained(FIXTURE / "model")


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "expected.safetensors"))


def real(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The unpadded positions of ``tensor`` [B, S, ...]."""
    return tensor[mask.bool()]


@pytest.mark.parametrize("steps", range(1, 9))
def test_forward_matches_official(model: OuroLM, expected: dict[str, torch.Tensor], steps: int) -> None:
    ids, mask, positions = expected["input_ids"], expected["attention_mask"], expected["position_ids"]
    with torch.no_grad():
        out = model(ids, num_steps=steps, attention_mask=mask, position_ids=positions, return_trajectory=True)
        lambdas = torch.stack([model.exit_lambda(state) for state in out.trajectory])
        assert len(out.trajectory) == steps
        torch.testing.assert_close(
            real(out.logits, mask), real(expected[f"logits_{steps}"], mask), atol=TOLERANCE, rtol=0
        )
        for t in range(steps):
            torch.testing.assert_close(
                real(out.trajectory[t], mask),
                real(expected[f"hidden_{steps}"][t], mask),
                atol=TOLERANCE,
                rtol=0,
            )
            torch.testing.assert_close(
                real(lambdas[t], mask), real(expected[f"lambda_{steps}"][t], mask), atol=TOLERANCE, rtol=0
            )
        for threshold in (0.5, 0.9):
            chosen = model(
                ids, num_steps=steps, attention_mask=mask, position_ids=positions, exit_threshold=threshold
            ).logits
            torch.testing.assert_close(
                real(chosen, mask),
                real(expected[f"threshold_{threshold}_logits_{steps}"], mask),
                atol=TOLERANCE,
                rtol=0,
            )


@pytest.mark.parametrize("steps", range(1, 9))
def test_cached_batched_generation_matches_official(
    model: OuroLM, expected: dict[str, torch.Tensor], steps: int
) -> None:
    ids, mask = expected["input_ids"], expected["attention_mask"]
    official = expected[f"generated_{steps}"]
    ours = generate(
        model, ids, attention_mask=mask, max_new_tokens=official.shape[1] - ids.shape[1], num_steps=steps
    )
    assert torch.equal(ours.sequences, official)


@pytest.mark.parametrize("steps", range(1, 9))
@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_gate_full_generation_matches_official_exit(
    model: OuroLM, expected: dict[str, torch.Tensor], steps: int, threshold: float
) -> None:
    """The official generate with ``early_exit_threshold`` computes every step and reads each token at its
    exit: ``gate-full`` gives its tokens, batched and left-padded."""
    ids, mask = expected["input_ids"], expected["attention_mask"]
    official = expected[f"generated_gate_{threshold}_{steps}"]
    ours = generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=official.shape[1] - ids.shape[1],
        num_steps=steps,
        exit=f"gate-full:{threshold}",
    )
    assert torch.equal(ours.sequences, official)


def test_fixture_is_informative(expected: dict[str, torch.Tensor]) -> None:
    """Depth changes the official answer and the gate's probabilities are spread, so the checks above can fail."""
    assert not torch.allclose(expected["logits_1"], expected["logits_8"], atol=1e-2)
    lambdas = expected["lambda_4"]
    assert float(lambdas.min()) < 0.3 and float(lambdas.max()) > 0.7
    generated = torch.stack([expected[f"generated_{s}"][:, 8:] for s in range(1, 9)])
    assert len({tuple(g.flatten().tolist()) for g in generated}) > 1
    gated = [expected[f"generated_gate_0.5_{s}"] for s in range(2, 9)]  # the exit moves the official tokens
    assert any(
        not torch.equal(g, expected[f"generated_{s}"]) for s, g in zip(range(2, 9), gated, strict=True)
    )
