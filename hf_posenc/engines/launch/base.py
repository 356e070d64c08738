"""The records of :mod:`hf_posenc.engines.launch`: what an engine is told of a checkpoint (:class:`Served`), what
it answers (:class:`Launch`); each engine's module registers its launcher in its engine record
(:mod:`hf_posenc.engines.registry`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from ...methods import METHODS

COMPUTES = ("same", "not measured", "within_original", "past_original", "cannot")
SAME, NOT_MEASURED, WITHIN, PAST, CANNOT = COMPUTES


@dataclass(frozen=True)
class Served:
    """What an engine needs to know of the checkpoint it is to serve (built by
    :func:`hf_posenc.serving.launch_settings.describe`).

    path: the folder or ``.gguf`` file; gguf: whether it is a GGUF; method / native / family: from its hf_posenc
    record (``none``, True, ``rope_decoder`` for a plain checkpoint); original: the trained context L; context: the
    context it advertises (``max_position_embeddings``, a GGUF's ``context_length``); model_type: config.json's (or
    the GGUF architecture); rope: config.json's ``rope_parameters`` (per-layer-type RoPE: those of the layer type
    the patch changed, ``full_attention`` by default, with every type in ``rope_layer_types``); support: the method
    record's ``{engine name: EngineSupport}``; llama_cpp: the RoPE metadata llama.cpp needs for the method (short names:
    type, factor, original, base, attn_factor, context; a ``rope_freqs`` tensor as ``freqs: True``), or None with
    ``llama_cpp_refusal`` saying why llama.cpp cannot compute it -- unless ``llama_cpp_unjudged`` names what
    hf_posenc does not know of the checkpoint to tell (another architecture's GGUF reading, no attention geometry):
    then llama.cpp may compute it, and only the engine says; frozen_at: the length a dynamic method was
    frozen at; restored: the context hf_posenc.from_pretrained restores for a method saved as the original model;
    dual_chunk: config.json's ``dual_chunk_attention_config`` (``patch --dual-chunk-config``); legacy: the
    transformers-4 keys (``rope_theta``, ``rope_scaling``, ...) config.json carries when they state the RoPE of its
    ``rope_parameters`` (:func:`hf_posenc.checkpoints.legacy_rope.stated`), else None; stated: the context
    config.json's ``max_position_embeddings`` states (None: ``context``), below ``context`` where a YaRN left at its
    pretraining length serves more (Qwen's recipe): llama.cpp's converter writes it as the GGUF's context_length,
    and SGLang derives its context from it."""

    path: str
    gguf: bool
    method: str
    native: bool
    family: str
    original: int
    context: int
    model_type: str
    rope: dict[str, Any] = field(default_factory=dict)
    support: dict[str, Any] = field(default_factory=dict)
    llama_cpp: dict[str, Any] | None = None
    llama_cpp_refusal: str | None = None
    llama_cpp_unjudged: str | None = None
    frozen_at: int | None = None
    restored: int | None = None
    dual_chunk: dict[str, Any] | None = None
    legacy: dict[str, Any] | None = None
    rope_layer_types: tuple[str, ...] | None = None
    stated: int | None = None

    @property
    def stated_context(self) -> int:
        """config.json's ``max_position_embeddings`` (a GGUF's context_length), else the advertised context."""
        return self.stated or self.context


@dataclass(frozen=True)
class Launch:
    """One engine's settings for one checkpoint. computes: ``same`` (measured on this engine), ``not measured``
    (the engine reads the fields transformers reads), ``within_original`` (the same up to L only),
    ``past_original`` (the same for inputs longer than L only: longrope's long factors for every input) or ``cannot``;
    reason: why, in a sentence; steps: commands to run first (a conversion); command: the server's command line;
    env: its environment variables; files: {name: text ending with a line break} to write first (an Ollama
    Modelfile); python: the same launch as keywords of the engine's Python API (``vllm.LLM``, ``llama_cpp.Llama``)
    where it has one; max_length: the longest input it is launched for; checked: how these settings are known
    (launched by a test here, or read from the engine's documented reader and not launched here); notes: what else
    a user should know."""

    engine: str
    computes: str
    reason: str
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    steps: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    python: dict[str, Any] | None = None
    max_length: int | None = None
    checked: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.computes not in COMPUTES:
            raise ValueError(f"Launch.computes must be one of {COMPUTES}, got {self.computes!r}")
        unended = [name for name, body in self.files.items() if body and not body.endswith("\n")]
        if unended:
            raise ValueError(f"Launch.files must hold text ending with a line break; {unended} do not")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shell(self) -> list[str]:
        """The settings as shell lines to run in order: each file written (a quoted here-document whose delimiter
        its text does not hold), the steps, the command with its environment; every word quoted for the shell."""
        lines = []
        for name, body in self.files.items():
            end = delimiter(body)
            lines += [f"cat > {shlex.quote(name)} <<'{end}'", *body.split("\n")[:-1], end]
        lines += [shlex.join(step) for step in self.steps]
        if self.command:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
            lines.append((env + " " if env else "") + shlex.join(self.command))
        return lines

    def text(self, level: int = 2) -> str:
        """The settings as a user reads them: the verdict, then what to run (a heading of ``level``)."""
        lines = [f"{'#' * level} {self.engine}: {self.computes}", "", self.reason]
        shell = self.shell()
        if shell:  # as a shell runs it: unindented, in a fenced block
            fence = fence_for(shell)
            lines += ["", fence + "bash", *shell, fence]
        if self.python:
            lines += ["", "Python: " + ", ".join(f"{k}={v!r}" for k, v in self.python.items())]
        lines += [""] + [f"- {note}" for note in self.notes] + ([f"- {self.checked}"] if self.checked else [])
        return "\n".join(lines).rstrip() + "\n"


def delimiter(body: str) -> str:
    """A here-document delimiter that ``body`` does not hold anywhere (so no line of it ends the document early)."""
    end, n = "EOF", 0
    while end in body:
        n += 1
        end = f"EOF_{n}"
    return end


def fence_for(lines: list[str]) -> str:
    """A Markdown code fence for ``lines``: backticks, more of them than any run of backticks the lines hold."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)




def stored_unread(method: str) -> bool:
    """Whether a checkpoint of ``method`` whose hf_posenc record says native: false holds a RoPE scaling the engines
    implement, stored in a form they do not read (not rope_parameters that rebuild its frequencies)."""
    spec = METHODS.get(method)
    return spec is not None and spec.kind == "rope"


def unserved(method: str) -> str:
    """Why no engine serves a checkpoint of ``method`` whose hf_posenc record says native: false."""
    if stored_unread(method):
        return (f"its `{method}` is not stored as rope_parameters that rebuild its frequencies; only "
                "hf_posenc.from_pretrained re-applies it")
    return f"no engine implements `{method}`"


def not_native(served: Served, engine: str, what_it_does: str) -> Launch:
    """The launch of a checkpoint whose method this engine does not compute from its config: none, and what it
    does instead."""
    if stored_unread(served.method):
        lead = f"{engine} cannot compute this checkpoint ({unserved(served.method)}"
    else:
        who = "only SGLang reads its dual_chunk_attention_config" if served.dual_chunk else "no engine implements it"
        lead = f"{engine} does not implement `{served.method}` ({who}"
    return Launch(engine, CANNOT, f"{lead}; the checkpoint's hf_posenc record says native: false); {what_it_does}.")


class TooLong(ValueError):
    """A length past what one engine computes right for a checkpoint: that ``engine``'s answer, not the command's."""

    def __init__(self, engine: str, message: str):
        super().__init__(message)
        self.engine = engine


@dataclass(frozen=True)
class Most:
    """The longest context an engine's own settings hold, ``tokens``, and ``why`` (the type that holds it)."""

    tokens: int
    why: str


INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1


def length_for(served: Served, length: int | None, engine: str, limit: int | None = None, *, most: Most) -> int:
    """The input length to launch for: ``length`` or the checkpoint's advertised context; past ``limit`` (the most
    the engine computes right for it) or past ``most`` (the most its settings hold) refused with the reason."""
    n = served.context if length is None else length
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"--max-length must be a whole number of tokens >= 2, got {length!r}")
    if limit is not None and n > limit and limit <= most.tokens:
        raise TooLong(engine, f"{engine} computes this checkpoint up to {limit:,} tokens (the context it can be "
                              f"launched for), not {n:,}: give --max-length {limit} or less")
    if n > most.tokens:
        raise TooLong(engine, f"{engine} takes a context of at most {most.tokens:,} tokens ({most.why}), not {n:,}: "
                              f"give --max-length {most.tokens} or less")
    return n

