"""Ollama: a Modelfile ``FROM FILE.gguf`` + ``PARAMETER num_ctx N``, then ``ollama create`` (not launched here).

Read from Ollama's source (ollama/ollama): since PR #16031 (2026-05-29) it runs GGUF models with llama.cpp's
``llama-server`` (``llm/llama_server.go``), passing ``-c num_ctx`` and no RoPE flag, so the GGUF's RoPE metadata is
read by llama.cpp's loader (:mod:`.llama_cpp`); ``num_ctx`` is clamped to the GGUF's ``context_length``
(``llm/server.go``), which ``hf-posenc patch --gguf`` sets to the extended context. Before it, Ollama's own engine
read only ``rope.scaling.factor`` for llama and qwen2 and applied it as linear scaling whatever the type.
The Modelfile's ``rope_frequency_base`` / ``rope_frequency_scale`` were removed in 2024 (PR #1983).
"""

from __future__ import annotations

import os

from .base import CANNOT, NOT_MEASURED, Launch, Served, length_for, not_native, register
from .llama_cpp import gguf_of

ENGINE = "Ollama"
CHECKED = ("not launched here: read from Ollama's llm/llama_server.go (llama-server, no RoPE flags), llm/server.go "
           "(num_ctx clamped to the GGUF's context_length) and docs/modelfile.mdx")


@register("ollama")
def launch(served: Served, length: int | None) -> Launch:
    if not served.native:
        return not_native(served, ENGINE, "Ollama runs the converted GGUF through llama.cpp, which computes plain RoPE "
                                          "past the original context: served wrong there")
    if served.llama_cpp is None:
        return Launch(ENGINE, CANNOT, f"Ollama runs GGUFs through llama.cpp, which cannot compute this checkpoint: "
                                      f"{served.llama_cpp_refusal}.", checked=CHECKED)
    n = length_for(served, length, ENGINE, served.context)
    gguf, steps = gguf_of(served)
    name = os.path.splitext(os.path.basename(os.path.normpath(served.path)))[0]
    steps.append(["ollama", "create", name, "-f", "Modelfile"])
    notes = ["Ollama releases before PR #16031 (2026-05-29) ran llama and qwen2 GGUFs in their own engine, which "
             "applies rope.scaling.factor as linear scaling whatever the type: a yarn GGUF is served as pi there"]
    return Launch(ENGINE, NOT_MEASURED, "Ollama runs the GGUF with llama.cpp's llama-server, which reads the method "
                                        "from its metadata (see llama.cpp); not measured here.",
                  files={"Modelfile": f"FROM {gguf}\nPARAMETER num_ctx {n}\n"}, steps=steps,
                  command=["ollama", "run", name], max_length=n, checked=CHECKED, notes=notes)
