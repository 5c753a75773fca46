#!/usr/bin/env bash
# Trains the small models shipped in src/latentloop/resources/pretrained/ and copies them into the package.
# The shipped files are the final checkpoints of three runs: TRM of `latentloop run sudoku-scaling` and
# GRAM's long N-Queens run (configs/nqueens8-gram-long.yaml, docs/RESULTS.md, with the value head `latentloop
# fit-value` fitted to its samples), both stopped at their time budgets, and TRM seed 0 of `latentloop run
# sudoku9` (its whole schedule). Each command below replays exactly the
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

# 9x9 Sudoku: TRM seed 0 of `latentloop run sudoku9` at 36 clues, the tier before the experiment's 30 (3,300
# batches on one thread), chosen on the validation split over GRAM, and solved the PTRM way by default (solve.yaml: noise on its latent state, 20 samples at 8
# steps, answered by vote).
OMP_NUM_THREADS=1 .venv/bin/latentloop train --config configs/sudoku9-trm.yaml --out runs/pretrained/sudoku9-trm \
  train.eval_every=0 train.seed=0 task.clues=36
ship runs/pretrained/sudoku9-trm sudoku9-trm
cat > src/latentloop/resources/pretrained/sudoku9-trm/solve.yaml <<'YAML'
# The setting `latentloop solve sudoku PUZZLE` uses with this model, chosen on the 500 validation puzzles
# (latentloop eval RUN --split validation --width-depths 4,8,16 --samples-grid 1,5,10,20 --state-noise 0.3):
# 99.8% by vote; one trajectory without noise solves 88.6% at 8 steps.
steps: 8
samples: 20
select: vote
state_noise: 0.3
YAML

# N-Queens 8x8: GRAM, the 15,380 batches its long run trained in 235 minutes, then its value head fitted to
# its own samples (1,000 updates, a few minutes).
.venv/bin/latentloop train --config configs/nqueens8-gram-long.yaml --stop-at 15380 --out runs/pretrained/nqueens8-gram
.venv/bin/latentloop fit-value runs/pretrained/nqueens8-gram
ship runs/pretrained/nqueens8-gram nqueens8-gram
