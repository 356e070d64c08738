"""Ollama: a Modelfile ``FROM FILE.gguf`` + ``PARAMETER num_ctx N``, then ``ollama create`` (not launched here).

Read from Ollama's source (ollama/ollama): since PR #16031 (2026-05-29) it runs GGUF models with llama.cpp's
``llama-server`` (``llm/llama_server.go``), passing ``-c num_ctx`` and no RoPE flag, so the GGUF's RoPE metadata is
read by llama.cpp's loader (:mod:`.llama_cpp`); ``num_ctx`` is clamped to the GGUF's ``context_length``
(``llm/server.go``), which ``hf-posenc patch --gguf`` sets to the extended context. Before it, Ollama's own engine
read only ``rope.scaling.factor`` for llama and qwen2 and applied it as linear scaling whatever the type.
The Modelfile names the GGUF double-quoted; a path it cannot hold (a double quote, a line break) is refused by name.
The Modelfile's ``rope_frequency_base`` / ``rope_frequency_scale`` were removed in 2024 (PR #1983).
"""

from __future__ import annotations

import os
import re

from ..registry import Engine, register_engine
from .base import CANNOT, INT32_MAX, NOT_MEASURED, Launch, Most, Served, length_for, not_native
from .llama_cpp import context_key, gguf_of, unjudged_reason

ENGINE = "Ollama"
CHECKED = ("not launched here: read from Ollama's llm/llama_server.go (llama-server, no RoPE flags), llm/server.go "
           "(num_ctx clamped to the GGUF's context_length) and docs/modelfile.mdx")
MOST = Most(INT32_MAX, "Ollama gives num_ctx to llama-server as --ctx-size, a C int")


def model_name(path: str) -> str:
    """The name ``ollama create`` is given for the checkpoint at ``path``: its file or folder name in lowercase
    letters, digits and single hyphens, 2 to 80 characters (a model name Ollama's types/model/name.go takes)."""
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:80].strip("-")
    return name if len(name) >= 2 else f"hf-posenc-{name}".strip("-")


def unwritable(gguf: str) -> list[str]:
    """The characters of ``gguf`` a Modelfile's FROM value cannot hold: Ollama's parser (parser/parser.go) reads a
    double-quoted value up to the last double quote, with no escapes, ends it at a line break after a closing quote
    and drops non-printable characters other than a tab."""
    return sorted({c for c in gguf if c == '"' or not (c.isprintable() or c == "\t")})


def from_value(gguf: str) -> str:
    """``gguf`` as a Modelfile's FROM value: double-quoted (a relative path starting with ~ as ./~..., which Ollama
    would otherwise read as a home folder)."""
    return '"' + ("./" + gguf if gguf.startswith("~") else gguf) + '"'


def launch(served: Served, length: int | None) -> Launch:
    if not served.native:
        return not_native(served, ENGINE, "Ollama runs the converted GGUF through llama.cpp, which computes plain RoPE "
                                          "past the original context: served wrong there")
    if served.llama_cpp is None and not served.llama_cpp_unjudged:
        return Launch(ENGINE, CANNOT, f"Ollama runs GGUFs through llama.cpp, which cannot compute this checkpoint: "
                                      f"{served.llama_cpp_refusal}.", checked=CHECKED)
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    gguf, steps = gguf_of(served)
    bad = unwritable(gguf)
    if bad:
        return Launch(ENGINE, CANNOT, f"Ollama's Modelfile cannot name the GGUF {gguf!r}: it holds "
                                      f"{', '.join(map(repr, bad))}; a FROM value is written between double quotes, "
                                      "which Ollama's parser (parser/parser.go) reads with no escapes, and cannot "
                                      "hold a double quote, a line break or a non-printable character. Rename the "
                                      "file or folder, or link it (ln -s) under a name without them, and run "
                                      "serve-config on that.", checked=CHECKED)
    name = model_name(served.path)
    notes = ["Ollama releases before PR #16031 (2026-05-29) ran llama and qwen2 GGUFs in their own engine, which "
             "applies rope.scaling.factor as linear scaling whatever the type: a yarn GGUF is served as pi there"]
    if n > served.stated_context and not served.gguf:  # the converted file, this recipe's own
        steps.append(["gguf-set-metadata", gguf, context_key(served), str(n), "--force"])
        notes.append(f"Ollama clamps num_ctx to the GGUF's context_length, which llama.cpp's converter writes from "
                     f"config.json's max_position_embeddings ({served.stated_context:,}, below the {served.context:,} "
                     "its scaling serves): gguf-set-metadata (gguf-py) raises it in the converted file first")
    elif n > served.stated_context:  # the file given: changed only by its owner
        notes.append(f"Ollama clamps num_ctx to the GGUF's context_length ({served.stated_context:,}), below the "
                     f"{n:,} asked: raise it first (gguf-set-metadata {gguf} {context_key(served)} {n} --force, which "
                     "changes the file in place; copy it first to keep it)")
    steps.append(["ollama", "create", name, "-f", "Modelfile"])
    reason = (unjudged_reason(served, "Ollama (llama.cpp's llama-server)") if served.llama_cpp is None else
              "Ollama runs the GGUF with llama.cpp's llama-server, which reads the method from its metadata (see "
              "llama.cpp); not measured here.")
    return Launch(ENGINE, NOT_MEASURED, reason,
                  files={"Modelfile": f"FROM {from_value(gguf)}\nPARAMETER num_ctx {n}\n"}, steps=steps,
                  command=["ollama", "run", name], max_length=n, checked=CHECKED, notes=notes)


register_engine(Engine("ollama", ENGINE, launch=launch, runs_on="llama.cpp",
                       runs_on_why="Ollama runs GGUFs with llama.cpp's llama-server (since ollama PR #16031, "
                                   "2026-05-29), which reads the RoPE from the GGUF's metadata; not run in Ollama "
                                   "here"))
