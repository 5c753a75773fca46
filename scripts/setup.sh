#!/usr/bin/env bash
# Create .venv (if needed) and install latentloop with its test tools. PyTorch's CPU build 2.13.0 is
# installed first when torch is missing, so pip never pulls a multi-GB CUDA build for the `torch>=2.4` requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
