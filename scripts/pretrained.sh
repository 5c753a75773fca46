#!/usr/bin/env bash
# Trains the small models shipped in src/latentloop/resources/pretrained/ and copies them into the package.
# The shipped files are the final checkpoints of two experiment runs (`latentloop run sudoku-scaling`, TRM;
# `latentloop run nqueens8`, AR), which stopped at their time budgets. Each command below replays exactly the
# batches its run trained (`--stop-at`, the same config, seed and learning-rate schedule; training is
# deterministic on one machine and thread count), without depending on how fast the machine is.
set -euo pipefail
cd "$(dirname "$0")/.."

ship() {  # RUN NAME: the run's newest checkpoint (config.json, EMA weights) and its config as run.yaml
  local run=$1 dest=src/latentloop/resources/pretrained/$2 checkpoint
  checkpoint=$(find "$run/checkpoints" -maxdepth 1 -name 'step_*' | sort | tail -n 1)
  rm -rf "$dest.partial" && mkdir -p "$dest.partial"
  cp "$checkpoint/config.json" "$checkpoint/model.safetensors" "$dest.partial/"
  cp "$run/config.yaml" "$dest.partial/run.yaml"
  rm -rf "$dest" && mv "$dest.partial" "$dest"
  echo "shipped $run ($(basename "$checkpoint")) as $dest"
}

# 6x6 Sudoku: TRM, the 152 batches `latentloop run sudoku-scaling` trains in its 15 minutes.
.venv/bin/latentloop train --config configs/sudoku-trm.yaml --stop-at 152 --out runs/pretrained/sudoku6-trm
ship runs/pretrained/sudoku6-trm sudoku6-trm

# N-Queens 8x8: the AR baseline, the 1270 batches `latentloop run nqueens8` trained in its 8 minutes (GRAM and TRM
# solve no board after that budget on a CPU; see docs/RESULTS.md).
.venv/bin/latentloop train --config configs/nqueens8-ar.yaml --stop-at 1270 --out runs/pretrained/nqueens8-ar
ship runs/pretrained/nqueens8-ar nqueens8-ar
