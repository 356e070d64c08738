"""vLLM as an engine of hf_posenc: a checkpoint folder served by ``vllm.LLM`` in a process of its own.

The engine runs in a child process (:mod:`.vllm_worker`, started with the Python that has vLLM: ``python=``, else
``$HF_POSENC_VLLM_PYTHON``, else this one), so that vLLM, which spawns workers and pins its own transformers, may
live in another environment (``scripts/setup.sh --vllm`` makes ``.venv-vllm``) and its memory is returned when it
closes. Token ids go in and out; the tokenizer stays here. :class:`EngineLM` gives the evaluations the calls they
make of a model (token NLL, argmax of the last positions, greedy continuation), computed by the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import torch

from ..adapters.layout import per_layer_type, scaled_by
from ..checkpoints.models import drop_gguf_quantizer
from ..io.provenance import scrub, secret_name
from .registry import Runner
from .scorer import EngineError, EngineRefused, check_start  # noqa: F401  (raised here; importable from here as before)
from .scorer import token_rows as _rows

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")
PYTHON_ENV = "HF_POSENC_VLLM_PYTHON"
INSTALL = ("install vLLM (GPU: pip install 'hf_posenc[vllm]'; CPU: bash scripts/setup.sh --vllm, then "
           f"{PYTHON_ENV}=.venv-vllm/bin/python), or name the Python that has it with --engine-python")




def engine_python(python: str | None = None) -> str:
    """The interpreter that runs vLLM: ``python``, else ``$HF_POSENC_VLLM_PYTHON``, else this one."""
    chosen = python or os.environ.get(PYTHON_ENV) or sys.executable
    if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
        raise ValueError(f"the engine's Python {chosen!r} is not an executable file; {INSTALL}")
    return chosen


def vllm_version(python: str | None = None) -> str:
    """vLLM's version under the engine's Python; a clear error when it has no (working) vLLM."""
    exe = engine_python(python)
    done = subprocess.run([exe, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"vLLM cannot be imported by {exe} ({scrub(last)}); {INSTALL}")
    return done.stdout.strip().splitlines()[-1]


# what torchrun and accelerate tell their processes: an engine started from one of them must not take itself for a
# rank of that launch (vLLM reads these to join a process group of its own)
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")


# vLLM ends the engine when one model step runs past VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s by default): the
# prefill of one long prompt on a CPU is longer (SmolLM2-135M at 24,576 tokens on 2 cores, vLLM 0.32); a value the
# user set is kept
STEP_TIMEOUT = ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")


def engine_env(gpus: list[str] | None = None) -> dict[str, str]:
    """The engine process's environment: this one without the launcher's variables, with ``gpus`` as the visible
    devices when given, and an hour for one model step unless the user set it (:data:`STEP_TIMEOUT`)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES
           and not k.startswith(("TORCHELASTIC_", "ACCELERATE_"))}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env.setdefault(STEP_TIMEOUT[0], STEP_TIMEOUT[1])
    return env


def rank_gpus(local_rank: int, per_engine: int) -> list[str] | None:
    """The GPUs of the engine of process ``local_rank`` when each process runs one engine over ``per_engine`` GPUs
    (tensor parallel): the ``local_rank``-th group of the visible ones. None without CUDA (vLLM's CPU build)."""
    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    group = devices[local_rank * per_engine:(local_rank + 1) * per_engine]
    if len(group) < per_engine:
        raise ValueError(f"process {local_rank} needs GPUs "
                         f"{local_rank * per_engine}..{(local_rank + 1) * per_engine - 1} "
                         f"for its engine (tensor-parallel-size {per_engine}), but {len(devices)} are visible")
    return group


class VllmEngine:
    """``vllm.LLM`` on the checkpoint ``folder``, in a child process; a context manager (closes the process).

    ``max_model_len``: None lets vLLM derive it from ``config.json`` (what a deployment gets); ``allow_long``
    lets an evaluation run a model past the context its config states (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``), as
    the transformers engine does. ``engine_args``: more keywords of ``vllm.LLM`` (``gpu_memory_utilization``, ...).
    ``gpus``: the GPUs it may use (``CUDA_VISIBLE_DEVICES``), when one engine runs per process (:func:`rank_gpus`)."""

    def __init__(self, folder: str, *, python: str | None = None, dtype: str = "float32", seed: int = 0,
                 max_model_len: int | None = None, allow_long: bool = False, tensor_parallel_size: int = 1,
                 engine_args: dict[str, Any] | None = None, log: str | None = None, gpus: list[str] | None = None):
        spec = {"model": os.path.abspath(folder), "dtype": dtype, "seed": seed, "max_model_len": max_model_len,
                "tensor_parallel_size": tensor_parallel_size, "engine_args": engine_args or {}}
        env = engine_env(gpus)
        if allow_long:
            env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        self.secrets = secret_values(engine_args)  # taken out of every message (the log keeps them: mode 0600)
        self.failed, self.own_log = False, log is None
        self.log = log or tempfile.mkstemp(prefix="hf_posenc_vllm_", suffix=".log")[1]
        self._log = open(self.log, "w", encoding="utf-8")
        # the spec goes on standard input, not argv: every user can read a process's argv (ps)
        self.proc = subprocess.Popen([engine_python(python), WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        try:
            self._send(spec)
            first = self._read()
            if not first.get("ready"):
                raise self._fail(f"vLLM did not start on {folder}: {first.get('message')}")
        except EngineError:
            self.close()
            raise
        self.max_model_len, self.version = int(first["max_model_len"]), first["version"]

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fail(self, message: str) -> EngineError:
        """The error to raise, with the log's errors and last lines, scrubbed; the log is kept."""
        self.failed = True
        return EngineError(scrub(message + log_excerpt(self.log), *self.secrets))

    def _send(self, obj: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the process is gone: reading its answer says so, with its log
            pass

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise self._fail(f"the vLLM process ended (exit status {code}) without answering")
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> list:
        """One request's results; :class:`EngineRefused` when the engine refused its input."""
        if self.proc.poll() is not None:
            raise self._fail(f"the vLLM process has ended (exit status {self.proc.returncode})")
        self._send(request)
        answer = self._read()
        if "refused" in answer:
            raise EngineRefused(scrub(answer["refused"], *self.secrets))
        if "error" in answer:
            raise self._fail(f"vLLM failed a request: {answer.get('message')}")
        return answer["results"]

    def close(self) -> None:
        """End the process; its log is removed when it served without a failure and ended cleanly, or is empty."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        served = not self.failed and self.proc.returncode == 0
        if self.own_log and os.path.exists(self.log) and (served or os.path.getsize(self.log) == 0):
            os.remove(self.log)


def secret_values(engine_args: dict[str, Any] | None) -> list[str]:
    """The values of the engine arguments whose names say secret (``hf_token``), to take out of messages."""
    return [str(v) for k, v in (engine_args or {}).items() if secret_name(k, flag=False) and isinstance(v, (str, int))
            and not isinstance(v, bool)]


_PREFIX = re.compile(r"^(?:\(\S+ pid=\d+\)\s+)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?")
_RAISED = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt)\b(?::|$)")
_DIED = re.compile(r"\b(?:died|killed|out of memory)\b", re.IGNORECASE)


def log_excerpt(path: str, errors: int = 5, last: int = 6) -> str:
    """What an engine's log says of a failure, for its error message: the log's name, its last ``errors`` distinct
    error lines (vLLM's ERROR records and exceptions, traceback frames left out: a worker's death is told there,
    far above the end) and its ``last`` lines. The caller scrubs it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            rows = [r.rstrip() for r in f if r.strip()]
    except OSError:
        return ""
    if not rows:
        return ""  # nothing to show, and the log is not kept
    causes = list(dict.fromkeys(c for c in map(_cause, rows) if c))[-errors:]
    shown = [f"(the engine's log: {path}; its errors:)", *causes] if causes else [f"(the engine's log: {path})"]
    return "\n" + "\n".join(shown + ["(its last lines:)", *rows[-last:]])


def _cause(row: str) -> str | None:
    """The message of a log line that tells of a failure (an ERROR record, an exception, a death), else None;
    a record of a lower level (vLLM's warnings quote exceptions it handled) is none."""
    prefix = _PREFIX.match(row)
    message = row[prefix.end():] if prefix else row
    if not message.strip() or message[0].isspace() or message.startswith("Traceback"):
        return None  # a traceback's frames
    if prefix:
        return message if prefix[1] in ("ERROR", "CRITICAL") else None
    return message if _RAISED.search(message) or _DIED.search(message) else None


class EngineLM:
    """What the evaluations ask of a causal LM, answered by an engine (``engine.ask``) serving it; ``config`` and
    ``generation_config``: the model's (the evaluations read a few of their fields); ``hf_model``: the model itself,
    where a caller needs it for what the engine does not compute."""

    input_device = torch.device("cpu")

    def __init__(self, engine: VllmEngine, config, generation_config=None, hf_model=None):
        self.engine, self.config, self.generation_config = engine, config, generation_config
        self.hf_model = hf_model  # the patched model it serves (lm-eval's wrapper reads its tokenizer setup from it)

    def token_nll(self, input_ids: torch.Tensor, start: int = 1) -> torch.Tensor:
        """As :func:`eval.scoring.token_nll`: NLL of tokens ``start .. T-1`` of each row, ``[batch, T - start]``."""
        rows = _rows(input_ids)
        check_start(start, len(rows[0]))
        answers = self.engine.ask({"op": "score", "prompts": rows})
        return -torch.tensor([a["logprobs"][start - 1:] for a in answers], dtype=torch.float32)

    def argmax_last(self, input_ids: torch.Tensor, n: int) -> torch.Tensor:
        """The most likely token after each of the last ``n`` positions of each row: ``[batch, n]``."""
        answers = self.engine.ask({"op": "score", "prompts": _rows(input_ids), "top": True})
        return torch.tensor([(a["top"] + [a["next"]])[-n:] for a in answers], dtype=torch.long)

    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int, stop: list[int]) -> list[list[int]]:
        """Each row's greedy continuation (at most ``max_new_tokens``, up to a ``stop`` token)."""
        return self.engine.ask({"op": "generate", "prompts": _rows(input_ids), "max_tokens": max_new_tokens,
                                "stop": stop})

    def close(self) -> None:
        self.engine.close()


def save_on_this_process(model, folder: str) -> None:
    """``model.save_pretrained(folder)`` by this process whatever its rank: transformers writes on rank 0 alone once
    torch.distributed is up, but each process of a data-parallel run serves its own copy. The instance is told so for
    the call only (no class is changed)."""
    model.should_save_on_this_rank = lambda is_main_process: True
    try:
        model.save_pretrained(folder)
    finally:
        del model.should_save_on_this_rank


def cover_positions(folder: str, tokens: int) -> None:
    """Raise the saved ``max_position_embeddings`` of an unscaled-RoPE checkpoint to ``tokens``: vLLM sizes its rotary
    table by it, and reads garbage past it (:func:`serving.vllm_positions`), while the math does not depend on it.
    What an evaluation past the stated context needs; a deployment reads the checkpoint as saved."""
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    text = config.get("text_config", config)
    rope = text.get("rope_parameters") or {}
    unscaled = all(scaled_by(rp) is None for rp in (rope.values() if per_layer_type(rope) else [rope]))
    if unscaled and text.get("max_position_embeddings", tokens) < tokens:
        text["max_position_embeddings"] = tokens
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)


class EnginePool:
    """The engine of the configuration being computed: the model, patched by it, saved to a temporary folder and
    started in vLLM on first use; closed when another configuration's turn comes, and at the end (cells run variant
    by variant, so adjacent variants of one configuration share an engine).
    ``max_model_len``: the tokens of the longest input; past the checkpoint's own context on purpose (an
    evaluation measures a model there, as the transformers engine does)."""

    def __init__(self, *, python: str | None, dtype: str, seed: int, max_model_len: int,
                 tensor_parallel_size: int = 1, engine_args: dict[str, Any] | None = None,
                 gpus: list[str] | None = None):
        # + 1: vLLM wants room for one generated token beside a scored prompt
        self.kwargs = dict(python=python, dtype=dtype, seed=seed, max_model_len=max_model_len + 1, allow_long=True,
                           tensor_parallel_size=tensor_parallel_size, engine_args=engine_args, gpus=gpus)
        self.key: str | None = None
        self.lm: EngineLM | None = None
        self.folder: tempfile.TemporaryDirectory | None = None

    def get(self, label: str, config: dict[str, Any], model) -> EngineLM:
        """The engine of the variant ``label`` of configuration ``config``, ``model`` being patched by it."""
        key = json.dumps(config, sort_keys=True)
        if self.key != key:
            self.close()

            print(f"hf_posenc: starting vLLM for {label} ...", file=sys.stderr)
            self.folder = tempfile.TemporaryDirectory(prefix="hf_posenc_vllm_")
            drop_gguf_quantizer(model)
            save_on_this_process(model, self.folder.name)
            cover_positions(self.folder.name, self.kwargs["max_model_len"])
            self.lm = EngineLM(VllmEngine(self.folder.name, **self.kwargs), model.config,
                               getattr(model, "generation_config", None), model)
            self.key = key
        return self.lm

    def close(self) -> None:
        if self.lm is not None:
            self.lm.close()
        if self.folder is not None:
            self.folder.cleanup()
        self.key = self.lm = self.folder = None


@contextlib.contextmanager
def open_scorer(path: str, settings, dtype: str, context: int, setup: dict[str, Any]):
    """vLLM serving the checkpoint folder ``path`` (started with ``settings``,
    :class:`engines.settings.EngineSettings`), as a scorer; with ``allow_long`` its maximum length is ``context`` + 1
    whatever ``config.json`` advertises."""
    with VllmEngine(path, python=settings.python, dtype=dtype, tensor_parallel_size=settings.tensor_parallel_size,
                    engine_args=settings.args, allow_long=settings.allow_long,
                    max_model_len=context + 1 if settings.allow_long else None) as served:
        setup.update(engine_max_model_len=served.max_model_len, engine_started=True, allow_long=settings.allow_long,
                     max_model_len_given="max_model_len" in (settings.args or {}))
        yield EngineLM(served, None)


RUNNER = Runner(ready=lambda settings: vllm_version(settings.python), open=open_scorer, takes_vllm_flags=True,
                scores_past_limits=True)
