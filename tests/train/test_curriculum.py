"""The depth curriculum and the supervision-step weights: the depth of each step, the weights by value, the
loss they weigh, and exact resume in the middle of a schedule."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from latentloop.errors import UsageError
from latentloop.models.reasoners import ReasonerOutput
from latentloop.tasks.base import get_task
from latentloop.train import distributed as dist
from latentloop.train import loop
from latentloop.train.curriculum import CurriculumStage, Depth, depth_at, recursion, step_weights
from latentloop.train.deep_supervision import TRAIN_WEIGHTS, DeepSupervision, supervision_loss
from latentloop.train.loop import fitted_steps, train
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER, tiny_run

CGAR = [CurriculumStage(until=0.3, cycles=2, inner=1), CurriculumStage(until=0.6, cycles=4, inner=2)]
MODEL = Depth(n_sup=16, cycles=6, inner=3)


def test_each_step_runs_at_the_depth_of_its_stage():
    depths = [depth_at(step, 10, CGAR, MODEL) for step in range(10)]
    assert depths[:3] == [Depth(16, 2, 1)] * 3  # steps 0, 1, 2 < 0.3 * 10
    assert depths[3:6] == [Depth(16, 4, 2)] * 3
    assert depths[6:] == [MODEL] * 4  # after the last stage: the model's own depth


def test_a_stage_that_grows_n_sup_keeps_the_other_values_of_the_model():
    stages = [CurriculumStage(until=0.5, n_sup=2)]
    assert depth_at(0, 4, stages, MODEL) == Depth(2, 6, 3)
    assert depth_at(2, 4, stages, MODEL) == MODEL


def test_a_stage_can_set_the_kl_weight():
    stages = [CurriculumStage(until=0.5, beta=0.0)]
    final = Depth(8, 1, 1, beta=0.07)
    assert depth_at(0, 4, stages, final) == Depth(8, 1, 1, beta=0.0)
    assert depth_at(2, 4, stages, final) == final


def test_the_stage_beta_is_the_kl_weight_of_its_steps(tmp_path):
    def losses(beta, curriculum=()):
        config = build_reasoner_config(
            tiny_run(TINY_REASONER, arch="gram", model={"beta": beta}, train={"curriculum": list(curriculum)})
        )
        return train(config, tmp_path / f"{beta}-{len(curriculum)}").losses

    annealed = losses(1.0, [{"until": 1.0, "beta": 0.0}])
    assert annealed == losses(0.0)
    assert annealed != losses(1.0)


def test_step_weights_decay_and_average_one():
    weights = step_weights(0.5, 3, torch.tensor([0, 1, 2]))
    mean = (1 + 0.5 + 0.25) / 3
    assert torch.allclose(weights, torch.tensor([1 / mean, 0.5 / mean, 0.25 / mean]))
    assert torch.equal(step_weights(1.0, 8, torch.tensor([0, 7])), torch.ones(2))


def test_recursion_restores_the_models_depth():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"cycles": 3, "inner": 4})()

    model = Model()
    with pytest.raises(RuntimeError), recursion(model, Depth(1, 1, 2)):
        assert (model.config.cycles, model.config.inner) == (1, 2)
        raise RuntimeError
    assert (model.config.cycles, model.config.inner) == (3, 4)


def _output(logits, kl):
    batch = logits.shape[0]
    return ReasonerOutput(
        logits=logits, halt_logit=torch.zeros(batch), value=torch.zeros(batch), kl=kl, continue_logit=None
    )


def test_weighted_loss_is_the_weighted_mean_of_the_samples_losses():
    tc = build_reasoner_config(TINY_REASONER).train
    torch.manual_seed(0)
    logits, labels, kl = torch.randn(2, 5, 4), torch.randint(1, 4, (2, 5)), torch.tensor([0.5, 2.0])
    plain, _ = supervision_loss(_output(logits, kl), labels, 0.1, tc)
    ones, _ = supervision_loss(_output(logits, kl), labels, 0.1, tc, weights=torch.ones(2))
    assert torch.allclose(plain, ones)
    first, _ = supervision_loss(_output(logits[:1], kl[:1]), labels[:1], 0.1, tc)
    only_first, parts = supervision_loss(
        _output(logits, kl), labels, 0.1, tc, weights=torch.tensor([2.0, 0.0])
    )
    assert torch.allclose(only_first, first)  # mean over 2 samples of (2 * loss_0 + 0 * loss_1)
    assert parts["kl"] == pytest.approx(1.25)  # the parts stay unweighted


def _config(**train):
    model = {"n_sup": 3, "cycles": 2, "inner": 2}
    return build_reasoner_config(
        tiny_run(TINY_REASONER, arch="trm", model=model, train={"steps": 4, **train})
    )


def test_a_curriculum_changes_the_updates_and_the_compute_of_each_step(tmp_path):
    curriculum = [{"until": 0.5, "n_sup": 1, "cycles": 1, "inner": 1}]
    result = train(_config(curriculum=curriculum), tmp_path / "run")
    assert len(result.losses) == 1 + 1 + 3 + 3  # n_sup 1 for steps 0 and 1, then the model's 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    flops = [r["flops"] for r in records if r["kind"] == "train"]
    per_step = [b - a for a, b in zip([0, *flops], flops, strict=False)]
    assert per_step[0] == per_step[1] and per_step[2] == per_step[3]
    # TRM with T=2, n=2 runs 2 * (2 + 1) = 6 passes of its network per supervision step, 3 of them with
    # gradient; T=1, n=1 runs 2, all with gradient. Three supervision steps against one:
    assert per_step[2] / per_step[0] == pytest.approx(3 * (3 * 3 + 3) / (3 * 2), rel=0.05)


@pytest.mark.parametrize("replace_halted", [False, True])
def test_resume_in_the_middle_of_a_curriculum_gives_the_same_weights(tmp_path, replace_halted):
    run = dict(
        curriculum=[{"until": 0.25, "n_sup": 1, "cycles": 1}, {"until": 0.75, "n_sup": 2}],
        step_weight_decay=0.7,
        replace_halted=replace_halted,
    )
    whole = train(_config(**run), tmp_path / "whole")
    first = train(_config(**run), tmp_path / "split", stop_at=2)  # inside the second stage
    second = train(_config(**run), tmp_path / "split")
    assert second.resumed_from == 2
    assert first.losses + second.losses == whole.losses
    assert second.counts["flops"] == whole.counts["flops"]
    a, b = (load_file(str(r.checkpoint / TRAIN_WEIGHTS)) for r in (whole, second))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_step_weights_change_training(tmp_path):
    plain = train(_config(), tmp_path / "plain")
    weighted = train(_config(step_weight_decay=0.5), tmp_path / "weighted")
    assert plain.losses[0] != weighted.losses[0]


@pytest.mark.parametrize(
    "curriculum, message",
    [
        ([{"until": 0.6}, {"until": 0.3}], "train.curriculum[1].until must be in (0.6, 1]"),
        ([{"until": 1.5}], "train.curriculum[0].until must be in (0, 1]"),
        ([{"until": 0.5, "cycles": 0}], "train.curriculum[0].cycles must be at least 1"),
        ([{"until": 0.5, "depth": 2}], "unknown config key train.curriculum.'depth'"),
        ([{"until": 0.5, "beta": -0.1}], "train.curriculum[0].beta must not be negative"),
    ],
)
def test_bad_curricula_are_one_clear_error(curriculum, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        _config(curriculum=curriculum)


def test_bad_step_weight_decay_is_one_clear_error():
    with pytest.raises(UsageError, match=re.escape("train.step_weight_decay must be in (0, 1]")):
        _config(step_weight_decay=0)


def test_labels_within_depth_are_refused_for_the_reasoners():
    with pytest.raises(UsageError, match="work_per_iteration is for the recurrent-depth LM"):
        _config(work_per_iteration=1.0)


class _LinearCost:
    """An objective whose every step costs 10 FLOPs."""

    flops = 100

    def schedule_flops(self, steps, done_steps, done_flops):
        return 10.0 * steps


def test_the_fitted_schedule_is_the_longest_whose_flops_fill_the_time_left():
    # 100 FLOPs spent in 10 steps; 5 FLOP/s for 20 s pays for 10 more steps
    assert fitted_steps(_LinearCost(), 10, 5.0, 20.0, most=1000) == 20
    assert fitted_steps(_LinearCost(), 10, 5.0, 21.9, most=1000) == 20  # a part of a step does not count
    assert fitted_steps(_LinearCost(), 10, 5.0, 20.0, most=15) == 15  # train.steps stays the most
    assert fitted_steps(_LinearCost(), 10, 5.0, -3.0, most=1000) == 10  # never fewer than the steps done


def test_a_curriculum_schedule_counts_each_stage_at_its_depth(tmp_path):
    config = build_reasoner_config(
        tiny_run(TINY_REASONER, model={"n_sup": 3}, train={"curriculum": [{"until": 0.5, "n_sup": 1}]})
    )
    trained = train(config, tmp_path / "run", stop_at=1)
    assert trained.counts["flops"] > 0
    objective = DeepSupervision(config, get_task("nqueens", n=5), tmp_path / "run", dist.DistContext(), "cpu")
    objective.setup()
    objective.build(None)
    per_update = objective.update_flops(Depth(3, 2, 2))
    # 10 batches: 5 of one supervision step, then 5 of the model's three
    assert objective.schedule_flops(10, 0, 0) == (5 * 1 + 5 * 3) * per_update
    # 7 batches: steps 0-3 come before half of the schedule (3.5)
    assert objective.schedule_flops(7, 0, 0) == (4 * 1 + 3 * 3) * per_update
    assert per_update == trained.counts["flops"]  # the first batch ran one update


def test_a_fitted_schedule_is_kept_in_checkpoints_and_by_a_resumed_run(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "FIT_SHARE", 0.0)  # time steps 10 to 15 whatever train.steps is
    monkeypatch.setattr(loop, "FIT_MIN_STEPS", 5)
    run = tiny_run(TINY_REASONER, train={"steps": 10**8, "budget_minutes": 1.0, "fit_steps": True})
    config = build_reasoner_config(run)
    first = train(config, tmp_path / "run", stop_at=20)
    fitted = config.train.steps
    assert 20 < fitted < 10**8  # a minute of steps of a few milliseconds each
    state = json.loads((first.checkpoint / "trainer_state.json").read_text())
    assert state["fitted_steps"] == fitted
    again = build_reasoner_config(run)
    resumed = train(again, tmp_path / "run", stop_at=22)
    assert again.train.steps == fitted  # the schedule the run fitted, not train.steps once more
    assert resumed.step == 22
    state = json.loads((resumed.checkpoint / "trainer_state.json").read_text())
    assert state["fitted_steps"] == fitted


def test_fitting_the_steps_needs_a_budget():
    with pytest.raises(UsageError, match=r"fit_steps needs train\.budget_minutes"):
        build_reasoner_config(tiny_run(TINY_REASONER, train={"fit_steps": True}))
