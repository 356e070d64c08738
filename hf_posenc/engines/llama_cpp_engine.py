"""llama.cpp as an engine of hf_posenc, through llama-cpp-python (its Python binding, built from source).

A saved checkpoint folder is converted to GGUF by llama.cpp's own converter (``convert_hf_to_gguf.py`` of a
llama.cpp source tree: ``$HF_POSENC_LLAMA_CPP_SOURCE``, else the one ``scripts/setup.sh --llama-cpp`` keeps in
``.llama-cpp/llama.cpp``, the tree vendored in llama-cpp-python's source distribution), exactly as a user converts
it, in float32 by default so that the comparison measures positions and not quantization; a ``.gguf`` file is read
as it is. :class:`LlamaCppLM` then answers the evaluations' questions (:class:`.scorer.Scorer`) from llama.cpp's
logits of every position (``logits_all``). llama.cpp never refuses a prompt longer than the context its GGUF was
trained on (it logs a warning and computes it): the context given (``n_ctx``) is the one asked for.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from typing import Any

import numpy as np
import torch

from ..io.provenance import scrub
from ..serving.gguf_file import is_gguf
from .registry import Runner
from .scorer import EngineError, EngineRefused, check_start
from .scorer import token_rows as _rows

SOURCE_ENV = "HF_POSENC_LLAMA_CPP_SOURCE"
DEFAULT_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              ".llama-cpp", "llama.cpp")
INSTALL = ("install llama-cpp-python and a llama.cpp source tree for its converter: bash scripts/setup.sh "
           f"--llama-cpp (builds it from source, 5-10 min on 2 cores), or pip install llama-cpp-python and set "
           f"{SOURCE_ENV} to a llama.cpp checkout")
CHUNK = 1024  # positions per log-softmax chunk (a [chunk, vocab] float32 block at a time)


def llama_cpp_version() -> str:
    """llama-cpp-python's version; a clear error when it is not installed (said before any slow work)."""
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        raise ValueError(f"llama.cpp is not installed (no llama-cpp-python in {sys.executable}); {INSTALL}") from None


def converter() -> str:
    """The path of llama.cpp's ``convert_hf_to_gguf.py``; a clear error when there is no source tree."""
    source = os.environ.get(SOURCE_ENV) or DEFAULT_SOURCE
    script = os.path.join(source, "convert_hf_to_gguf.py")
    if not os.path.isfile(script):
        raise ValueError(f"no llama.cpp converter at {script} ({SOURCE_ENV} or {DEFAULT_SOURCE}); {INSTALL}")
    return script


def convert(folder: str, outfile: str, outtype: str = "f32") -> str:
    """``folder`` (a transformers checkpoint) converted to the GGUF ``outfile`` by llama.cpp's converter, run with
    this Python (it imports torch, transformers and the tree's own gguf-py)."""
    done = subprocess.run([sys.executable, converter(), os.path.abspath(folder), "--outfile", outfile,
                           "--outtype", outtype], capture_output=True, text=True)
    if done.returncode != 0 or not os.path.isfile(outfile):
        tail = " | ".join(line for line in done.stderr.strip().splitlines()[-4:])
        raise EngineError(f"llama.cpp's converter could not convert {folder} (exit {done.returncode}): {scrub(tail)}")
    return outfile


_LOADING = threading.Lock()


@contextlib.contextmanager
def _weights_as_stored():
    """llama.cpp loads the weights without repacking them into CPU-specific layouts ("extra buffer types": the AMX
    and repack kernels of quantized matrices; ``llama_model_params.use_extra_bufts``, ``--no-repack`` in its CLI):
    the same math on the stored layout. Why: on CPUs that report AMX where the kernel or sandbox does not grant its
    tile state (this project's CI machines), the AMX kernels crash the process on the first quantized product.
    llama-cpp-python's ``Llama`` takes no such argument, so its default-parameter function is replaced while one
    model loads (under a lock) and restored."""
    import llama_cpp.llama_cpp as low

    with _LOADING:
        default = low.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = params
        try:
            yield
        finally:
            low.llama_model_default_params = default


class LlamaCppLM:
    """A GGUF file in llama.cpp (``llama_cpp.Llama``, every position's logits kept) as a :class:`.scorer.Scorer`:
    ``n_ctx`` tokens of context; ``config`` / ``generation_config``: the model's, for the evaluations' reads;
    ``llama_args``: more keywords of ``Llama`` (the RoPE flags of :mod:`.launch.llama_cpp`)."""

    input_device = torch.device("cpu")

    def __init__(self, gguf: str, n_ctx: int, config=None, generation_config=None, threads: int | None = None,
                 **llama_args):
        from llama_cpp import Llama

        self.config, self.generation_config, self.n_ctx = config, generation_config, n_ctx
        try:
            with _weights_as_stored():
                self.llm = Llama(model_path=gguf, n_ctx=n_ctx, n_batch=min(512, n_ctx), n_ubatch=min(512, n_ctx),
                                 logits_all=True, n_threads=threads or os.cpu_count(), verbose=False,
                                 **llama_args)
        except (ValueError, RuntimeError) as err:
            raise EngineError(f"llama.cpp could not load {gguf}: {scrub(str(err))}") from None

    def _logits(self, row: list[int]) -> np.ndarray:
        if len(row) > self.n_ctx:
            raise EngineRefused(f"{len(row)} tokens exceed the context llama.cpp was started with ({self.n_ctx})")
        self.llm.reset()
        self.llm.eval(row)
        return self.llm.scores[: len(row)]

    def token_nll(self, input_ids: torch.Tensor, start: int = 1) -> torch.Tensor:
        rows, out = _rows(input_ids), []
        check_start(start, len(rows[0]))
        for row in rows:
            logits, target = self._logits(row), torch.tensor(row[start:])
            nll = torch.empty(len(row) - start, dtype=torch.float32)
            for s in range(0, len(nll), CHUNK):  # the logits of positions start-1 .. T-2 predict tokens start .. T-1
                e = min(s + CHUNK, len(nll))
                block = torch.from_numpy(np.array(logits[start - 1 + s : start - 1 + e], dtype=np.float32))
                nll[s:e] = torch.nn.functional.cross_entropy(block, target[s:e], reduction="none")
            out.append(nll)
        return torch.stack(out)

    def argmax_last(self, input_ids: torch.Tensor, n: int) -> torch.Tensor:
        return torch.tensor([np.asarray(self._logits(row)[-n:]).argmax(-1).tolist() for row in _rows(input_ids)],
                            dtype=torch.long)

    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int, stop: list[int]) -> list[list[int]]:
        out = []
        for row in _rows(input_ids):
            new = [int(np.asarray(self._logits(row)[-1]).argmax())]
            while new[-1] not in stop and len(new) < max_new_tokens:
                if len(row) + len(new) >= self.n_ctx:
                    raise EngineRefused(f"{len(row)} prompt tokens and {max_new_tokens} new ones exceed the context "
                                        f"llama.cpp was started with ({self.n_ctx})")
                self.llm.eval([new[-1]])
                new.append(int(np.asarray(self.llm.scores[len(row) + len(new) - 1]).argmax()))
            out.append(new)
        return out

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "LlamaCppLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ready(settings) -> str:
    """llama-cpp-python's version, once it and llama.cpp's converter are known to be there."""
    version = llama_cpp_version()
    converter()
    return version


@contextlib.contextmanager
def open_scorer(path: str, settings, dtype: str, context: int, setup: dict[str, Any]):
    """llama.cpp scoring the GGUF ``path`` as it is, or the checkpoint folder ``path`` converted by llama.cpp's
    converter (float32), with a context of ``context`` tokens (llama.cpp takes any context it is given)."""
    if is_gguf(path):
        with LlamaCppLM(path, n_ctx=context) as served:
            setup.update(engine_context=context, engine_started=True, converted=None)
            yield served
        return
    with tempfile.TemporaryDirectory(prefix="hf_posenc_gguf_") as tmp:
        gguf = convert(path, os.path.join(tmp, "model-f32.gguf"))
        with LlamaCppLM(gguf, n_ctx=context) as served:
            setup.update(engine_context=context, engine_started=True, converted="f32")
            yield served


RUNNER = Runner(ready=ready, open=open_scorer, scores_gguf=True,
                no_flags_reason="llama.cpp runs in this process with the context the lengths need")
