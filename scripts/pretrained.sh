#!/usr/bin/env bash
# Trains the small models shipped in src/latentloop/resources/pretrained/ and copies them into the package.
# The shipped files are the final checkpoints of four runs: TRM of `latentloop run sudoku-scaling` and
# GRAM's long N-Queens run (configs/nqueens8-gram-long.yaml, docs/RESULTS.md, with the value head `latentloop
# fit-value` fitted to its samples), both stopped at their time budgets, and GRAM gram-seed-1 of
# `latentloop run sudoku9` (its whole schedule) and GRAM of `latentloop run nqueens10` (its whole schedule, with the
# value head it trained on its prior's samples). Each command below replays exactly the
# batches its run trained (`--stop-at`, the same config, seed and learning-rate schedule; training is
# deterministic on one machine and thread count, and resumes exactly), without depending on how fast the
# machine is. The N-Queens model takes about four hours on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."

ship() {  # RUN NAME: the run's newest checkpoint (config.json, EMA weights, a fitted value head) and its config
  local run=$1 dest=src/latentloop/resources/pretrained/$2 checkpoint
  checkpoint=$(find "$run/checkpoints" -maxdepth 1 -name 'step_*' | sort | tail -n 1)
  rm -rf "$dest.partial" && mkdir -p "$dest.partial"
  cp "$checkpoint/config.json" "$checkpoint/model.safetensors" "$dest.partial/"
  if [[ -f $checkpoint/value_head.safetensors ]]; then cp "$checkpoint/value_head.safetensors" "$dest.partial/"; fi
  cp "$run/config.yaml" "$dest.partial/run.yaml"
  rm -rf "$dest" && mv "$dest.partial" "$dest"
  echo "shipped $run ($(basename "$checkpoint")) as $dest"
}

# 6x6 Sudoku: TRM, the 152 batches `latentloop run sudoku-scaling` trained in 15 minutes with the paper's
# recursion (the overrides restore the config of that run; the shipped config now trains the cheaper recipe).
.venv/bin/latentloop train --config configs/sudoku-trm.yaml --stop-at 152 --out runs/pretrained/sudoku6-trm \
  "train.curriculum=[]" train.step_weight_decay=1.0 train.replace_halted=false train.lr=1e-3 \
  train.warmup_steps=100 train.steps=2000
ship runs/pretrained/sudoku6-trm sudoku6-trm

# 9x9 Sudoku: GRAM gram-seed-1 of `latentloop run sudoku9` (the medium tier, 3,175 batches on one thread, trained
# along its prior's trajectory, configs/sudoku9-gram.yaml), chosen on the validation splits over its seed 0 and
# over the hybrid that shipped before it (docs/results/sudoku9-exploration/README.md, "Choosing the shipped 9x9
# model"), and solved with 20 samples answered by its value head (solve.yaml; the steps keep one puzzle under a
# second on 2 cores).
OMP_NUM_THREADS=1 .venv/bin/latentloop train --config configs/sudoku9-gram.yaml --out runs/pretrained/sudoku9-gram \
  train.eval_every=0 train.seed=1 model.inner=3 train.steps=3175
ship runs/pretrained/sudoku9-gram sudoku9-gram
cat > src/latentloop/resources/pretrained/sudoku9-gram/solve.yaml <<'YAML'
# The setting `latentloop solve sudoku PUZZLE` uses with this model, chosen on the 500 validation puzzles of the
# medium tier (latentloop eval RUN --split validation --samples 20 --steps 32 --select value; the accuracy at
# every depth is in docs/results/sudoku9-exploration/shipped/recipe1-medium-val.json, the easy tier's in
# recipe1-easy-val.json): 16 steps keep one puzzle under a second on 2 cores (latentloop bench solve_latency).
steps: 16
samples: 20
select: value
YAML

# N-Queens 8x8: GRAM, the 15,380 batches its long run trained in 235 minutes, then its value head fitted to
# its own samples (1,000 updates, a few minutes).
.venv/bin/latentloop train --config configs/nqueens8-gram-long.yaml --stop-at 15380 --out runs/pretrained/nqueens8-gram
.venv/bin/latentloop fit-value runs/pretrained/nqueens8-gram
ship runs/pretrained/nqueens8-gram nqueens8-gram

# N-Queens 10x10: GRAM of `latentloop run nqueens10` (seed 0, its 2,920 batches on one thread), trained along the
# prior's trajectory (configs/nqueens10-gram.yaml), with the value head it learned from the verifier's verdict on
# its prior's answers; solved with 20 samples of 16 steps answered by that head, the setting chosen on the 200
# validation boards of its exploration runs (docs/results/gram-larger-puzzles-exploration).
OMP_NUM_THREADS=1 .venv/bin/latentloop train --config configs/nqueens10-gram.yaml --out runs/pretrained/nqueens10-gram \
  train.eval_every=0
ship runs/pretrained/nqueens10-gram nqueens10-gram
cat > src/latentloop/resources/pretrained/nqueens10-gram/solve.yaml <<'YAML'
# The setting `latentloop solve nqueens BOARD` uses with this model on 10x10 boards, chosen on the 200 validation
# boards of its recipe's exploration runs (docs/results/gram-larger-puzzles-exploration: `latentloop eval RUN
# --split validation --samples 20 --steps 16`, by the value head).
steps: 16
samples: 20
select: value
YAML
