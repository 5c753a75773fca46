"""Shipped experiments: train several reasoners on one task on fixed schedules, evaluate them alike, report.

An experiment is a YAML file in ``configs/experiments/``::

    description: N-Queens 8x8 under the GRAM protocol ...
    expected_minutes: 20        # the whole run on the reference machine (REFERENCE_MACHINE)
    models:                     # name -> run config (relative to this file) and key=value overrides
      gram: {config: ../nqueens8-gram.yaml, overrides: [train.steps=3000], reference_minutes: 8.5}
      trm: {config: ../nqueens8-trm.yaml, overrides: [train.lr=5e-4]}
    eval: {samples: 20, steps: 16, limit: 200}
    paper: {gram: {accuracy: 99.7, coverage: 90.3}}   # the paper's numbers, shown beside ours

Every model trains the fixed schedule its config and overrides give (``train.steps``), never "as many steps as
fit in N minutes", so a run's numbers do not depend on the machine's speed; only its duration does.
``expected_minutes`` is the whole run's duration on the reference machine (:data:`REFERENCE_MACHINE`) and a
model's ``reference_minutes`` its training there: ``latentloop run`` times each model's first batches and says
how long it will take on this machine. An explicit ``budget_minutes`` (or ``latentloop run --budget-minutes``)
caps the training time; a model the cap stops is reported as time-capped, N of its M planned steps, and its
numbers are not the experiment's reference result.

An experiment with ``kind: lm`` trains recurrent-depth language models instead and evaluates each at the
test-time depths ``eval.depths`` (``eval: {depths: [1, 2, 4, 8, 16, 32], limit: 1000}``). One with
``kind: generation`` trains reasoners on a task with a blank puzzle (digits, Sudoku) and draws
``eval.samples`` unconditional samples from each (``latentloop sample``): validity, and for digits the
classifier scores beside real held-out digits.

A model's own ``eval.*`` overrides change its evaluation alone, before the command line's: a generator's
sampling depth and temperature (``gram: {config: ..., overrides: [eval.steps=128, eval.temperature=0.5]}``),
an MDLM's unmasking steps. They are recorded in its row of ``results.json`` (``eval_overrides``).

One with ``kind: time-to-accuracy`` measures how fast reasoners reach a target accuracy and coverage, its
models being the rows of an ablation, each adding one option (override) to the row before::

    kind: time-to-accuracy
    models:
      baseline: {config: ../nqueens8-gram-long.yaml, overrides: [train.steps=2000]}
      longer: {config: ../nqueens8-gram-long.yaml, overrides: [train.steps=3000]}
    eval: {samples: 20, steps: 8, limit: 100, every: 250}   # a checkpoint every 250 batches
    targets: {accuracy: 95, coverage: 80}                   # percent; metrics: accuracy, coverage

Each model trains with ``train.checkpoint_every=<eval.every>`` and ``train.keep_checkpoints=0`` added to its
overrides, and every checkpoint is evaluated (``eval.samples``, ``eval.steps``, ``eval.limit``, ``eval.seed``,
``eval.temperature``; ``eval.select`` and ``eval.fit_value`` are not used): vote and single-sample accuracy and
coverage against the checkpoint's training minutes, examples seen and FLOPs (``null`` where a checkpoint does
not record them). The points are cached in ``OUT/<model>/curve.json`` keyed by step, so a rerun evaluates only
new checkpoints. The report gives each model's final numbers, the point at which each target was first reached
(or "not reached"), and each row's gain over the row before it: its time-to-target ratio where both reach a
target, else the difference in final accuracy and coverage; ``curves.png`` draws accuracy and coverage against
minutes, examples and FLOPs.

``jobs: 2`` (or ``latentloop run --jobs 2``) trains and evaluates two models at once, each in its own process.
``threads_per_model`` fixes the torch threads of each model (``latentloop run --threads N`` changes it): where
a model's compiled kernels use every thread (``train.compile_threads`` 0) the thread count decides how their
reductions are split and so the float rounding, which a shipped experiment therefore fixes, so that its numbers
are the same on a machine with any number of cores. Without it each model gets an
equal share of this process's threads. Each run's ``train.json`` records its ``torch_threads``. Progress bars
are off when models train side by side, and each model logs its lines to standard error.

:func:`run_experiment` trains each model in ``OUT/<model>`` (resuming an interrupted run; a finished run is not
trained again), evaluates it on the test split with depth (steps ``1..steps``) and width (samples
``1..samples``) curves, and writes ``results.json``, ``report.md``, ``curves.png`` and (tasks that draw
their answers) ``boards.png`` in ``OUT``. Every number in the report comes from ``results.json``, which in
turn holds each run's ``eval.json``. ``key=value`` overrides given for one run (:func:`load_experiment`) reach
every model's config or the evaluation, and are recorded in ``results.json``.

The package holds the experiment files' spec and loading (:mod:`~latentloop.experiments.spec`), the kinds of
experiment, each of which builds its runs, evaluates them and reports on them
(:mod:`~latentloop.experiments.kinds`: ``reasoners``, ``lm``, ``generation``, ``time-to-accuracy``), the run
itself (:mod:`~latentloop.experiments.runner`, with :mod:`~latentloop.experiments.training`,
:mod:`~latentloop.experiments.store`, :mod:`~latentloop.experiments.workers` and
:mod:`~latentloop.experiments.aggregation`) and the report made from its results (:mod:`~latentloop.experiments.report`); the spec's public names are importable from here.
"""

from latentloop.experiments.kinds import KINDS, register_kind
from latentloop.experiments.spec import (
    DEFAULT_EXPERIMENT,
    EXPERIMENTS_DIR,
    OVERRIDE_SECTIONS,
    REFERENCE_MACHINE,
    EvalSpec,
    Experiment,
    ModelSpec,
    available_experiments,
    load_experiment,
    positive_number,
)

# The runner and the reports (latentloop.experiments.runner, .report) load the training stack: importing
# them is left to their users, so that reading an experiment's spec stays fast.
__all__ = [
    "DEFAULT_EXPERIMENT",
    "EXPERIMENTS_DIR",
    "KINDS",
    "OVERRIDE_SECTIONS",
    "REFERENCE_MACHINE",
    "EvalSpec",
    "Experiment",
    "ModelSpec",
    "available_experiments",
    "load_experiment",
    "positive_number",
    "register_kind",
]
