#!/usr/bin/env bash
# Fill ./.whl (ignored) with the wheels the device machine lacks or has at other versions: the releases .venv holds
# of transformers and the packages it needs at those versions (tokenizers, huggingface_hub, hf-xet), and gguf and
# peft. The device machine reaches no registry, so scripts/gpu_checks.sh installs these from the carried folder.
#
#     bash scripts/gpu_wheels.sh      # then: run(command="bash scripts/gpu_checks.sh", carry=[".whl"])
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
pins=()
for name in transformers tokenizers huggingface_hub hf-xet gguf peft; do
  pins+=("$name==$("$PY" -c "from importlib.metadata import version; print(version('$name'))")")
done
rm -rf .whl.new && mkdir .whl.new
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 --python-version 3.12 -d .whl.new "${pins[@]}"
rm -rf .whl && mv .whl.new .whl
du -sh .whl && ls .whl
