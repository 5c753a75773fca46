#!/usr/bin/env bash
# Trains the small models shipped in src/latentloop/resources/pretrained/ and copies them into the package.
# The shipped files are the final checkpoints of two runs that stopped at their time budgets: TRM of
# `latentloop run sudoku-scaling`, and GRAM's long N-Queens run (configs/nqueens8-gram-long.yaml, docs/RESULTS.md)
# with the value head `latentloop fit-value` fitted to its samples. Each command below replays exactly the
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

# N-Queens 8x8: GRAM, the 15,380 batches its long run trained in 235 minutes, then its value head fitted to
# its own samples (1,000 updates, a few minutes).
.venv/bin/latentloop train --config configs/nqueens8-gram-long.yaml --stop-at 15380 --out runs/pretrained/nqueens8-gram
.venv/bin/latentloop fit-value runs/pretrained/nqueens8-gram
ship runs/pretrained/nqueens8-gram nqueens8-gram
