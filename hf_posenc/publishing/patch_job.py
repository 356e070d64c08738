"""``hf-posenc patch``: load a model, patch it, optionally evaluate it against the unpatched model, save
it complete with its model card, and optionally upload it."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints import runtime
from ..checkpoints.context import original_context
from ..checkpoints.models import resolve_source
from ..config import PosEncConfig
from ..eval.settings import LoadSettings, OutputSettings, RunSettings
from ..eval.tasks import PatchEval, parse_evals
from ..io.documents import gather_documents
from ..io.output_folder import ReplacedOutput, check_replaced_output
from ..methods import resolve_method
from ..methods.rope import SCALINGS
from ..patching import get_config, patch, unpatch
from ..serving.check import CheckSettings, EngineSettings, check_engine_flags, engine_ready, serve_table
from ..serving.check import serve_check as check_folder
from ..serving.dual_chunk_config import check_dual_chunk_config, written_with_block
from ..serving.freezing import freeze
from .hub import UPLOAD_TIMEOUT, save_pretrained, upload, write_model_card


def default_eval_lengths(original: int, factor: float | None) -> list[int]:
    """Evaluate where it matters: the original context and the extended one."""
    extended = int(original * (factor or 1.0))
    return sorted({original, extended})


def _lengths_of(lm, config: PosEncConfig, evals, given: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each task's lengths: its ``--<lengths_flag>-lengths``, else the original context and the extended one."""
    original = original_context(lm)
    unsized = sorted({task.patch.lengths_flag for task, _ in evals if not given.get(task.patch.lengths_flag)})
    if original is None and unsized:  # T5: relative buckets, no context length to evaluate around
        raise ValueError(f"{type(lm).__name__} has no fixed context length to evaluate around; pass "
                         + " / ".join(f"--{flag}-lengths" for flag in unsized))
    around = default_eval_lengths(original, config.factor) if original is not None else None
    return {task.name: given.get(task.patch.lengths_flag) or around for task, _ in evals}


@dataclass(frozen=True)
class PatchEvals:
    """What ``patch --eval`` runs on the unpatched and the patched model before the save: ``names`` of registered
    eval tasks (:mod:`eval.tasks`: ppl, passkey, retrieval, ``harness:TASK`` with an lm-eval task, e.g.
    ``harness:niah_single_1``); ``lengths`` by a task's ``lengths_flag`` ("ppl", "passkey", "harness"), default the
    original context and the extended one; the documents of ``text_file`` (read as ``encoding``; default: the default
    corpus); ``max_windows`` (ppl), ``depths`` and ``trials`` (passkey, retrieval), ``harness_limit`` and
    ``max_gen_tokens`` (harness)."""

    names: list[str] = field(default_factory=list)
    lengths: dict[str, list[int]] = field(default_factory=dict)
    text_file: list[str] = field(default_factory=list)
    encoding: str = "utf-8"
    max_windows: int = 1
    depths: list[float] | None = None
    trials: int = 2
    harness_limit: int | None = 50
    max_gen_tokens: int | None = None


@dataclass(frozen=True)
class UploadSettings:
    """Where the saved folder goes on the Hub (``repo_id``) and how: ``private``, ``revision``, ``commit_message``,
    ``timeout`` (seconds per request; default :data:`hub.UPLOAD_TIMEOUT`)."""

    repo_id: str | None = None
    private: bool | None = None
    revision: str | None = None
    commit_message: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class PatchJob:
    """The whole ``hf-posenc patch`` job: ``config`` applied to the model of ``load`` (its ``model``, ``dtype``,
    ``device``, ``tokenizer``), saved into ``output`` with its model card. ``evals``: what is evaluated first;
    ``upload``: the Hub repository it is sent to after. ``serve_check``: an engine (``vllm``) that the saved folder
    is checked in (:mod:`hf_posenc.serving.check`, at ``serve_check_lengths``, with ``engine_python``) before it is
    moved into place; its verdicts go into the card's Serving section and its report beside the others.
    ``freeze_at``: ``config`` (a length-dependent method) is replaced by the static one equal to it at that many
    tokens (:mod:`hf_posenc.serving.freezing`), evaluated and saved. ``dual_chunk_config``: a DCA checkpoint of a
    Qwen2-family model also gets Qwen's ``dual_chunk_attention_config`` (:mod:`hf_posenc.serving.dual_chunk_config`).
    ``tuned``: the report of the ``hf-posenc tune`` run that chose ``config`` (its table goes into the card)."""

    load: LoadSettings
    config: PosEncConfig
    output: str
    evals: PatchEvals = field(default_factory=PatchEvals)
    upload: UploadSettings = field(default_factory=UploadSettings)
    serve_check: str | None = None
    engine_python: str | None = None
    serve_check_lengths: list[int] | None = None
    freeze_at: int | None = None
    dual_chunk_config: bool = False
    tuned: dict[str, Any] | None = None
    seed: int = 0
    command: str | None = None
    progress: bool = True


def patch_and_save(job: PatchJob) -> dict[str, Any]:
    """The whole ``hf-posenc patch`` job (:class:`PatchJob`); returns what was done (folder, reports, commit URL)."""
    model, dtype, device, tokenizer = job.load.model, job.load.dtype, job.load.device, job.load.tokenizer
    config, output, up, dual_chunk_config = job.config, job.output, job.upload, job.dual_chunk_config
    evals = _checked_before_load(job)
    with ReplacedOutput(output, "patch") as out:  # one run per --output, from here to the save
        docs = gather_documents(text_file=job.evals.text_file, encoding=job.evals.encoding) \
            if any(t.reads_documents for t, _ in evals) else []
        lm, tok, src = runtime.load_model_and_tokenizer(model, dtype, device, tokenizer=tokenizer,
                                                        need_tokenizer=bool(evals))
        if job.freeze_at is not None:  # the static configuration, resolved against the model, is what follows
            config = get_config(freeze(lm, config, job.freeze_at))
            unpatch(lm)
        if dual_chunk_config:  # the family, once the model is loaded, before any evaluation
            check_dual_chunk_config("dca", getattr(lm.config, "model_type", None))
        reports = _evaluations(job, config, evals, docs, (lm, tok, src))
        patch(lm, config)
        card = dict(base_model=model, repo_id=up.repo_id, command=job.command)
        with out.staged() as staged, _dual_chunk(lm, dual_chunk_config):  # a failure leaves --output as it was
            save_pretrained(lm, staged, tok, eval_results=reports, **card)
            if job.serve_check:
                check = check_folder(staged, EngineSettings(job.serve_check, job.engine_python),
                                     CheckSettings(job.serve_check_lengths, dtype=dtype), tokenizer=tokenizer,
                                     progress=job.progress, command=job.command)
                check["setup"]["folder"] = os.path.abspath(output)  # where it will be, not the staging folder
                check["table"] = serve_table(check)
                reports.append(check)
                write_model_card(lm, staged, eval_results=reports, serve_check=check, **card)
        done: dict[str, Any] = {"output": output, "reports": reports, "commit_url": None,
                                "tokenizer_saved": tok is not None}
        if up.repo_id:  # still under the lock: no other run replaces the folder while it is sent
            done["commit_url"] = upload(output, up.repo_id, private=up.private, revision=up.revision,
                                        commit_message=up.commit_message, timeout=up.timeout or UPLOAD_TIMEOUT)
    return done


def _checked_before_load(job: PatchJob) -> list:
    """What the job's flags alone refuse, and the serving engine readied, before the slow load: the parsed
    ``(task, arguments)`` of ``--eval``."""
    up, given = job.upload, job.evals
    evals = parse_evals(given.names)
    for task, arguments in evals:
        if task.patch.check_lengths and given.lengths.get(task.patch.lengths_flag):
            task.patch.check_lengths(given.lengths[task.patch.lengths_flag], arguments)
    check_replaced_output(job.output, "patch", resolve_source(job.load.model).path, given.text_file)
    if (up.private or up.revision) and not up.repo_id:
        raise ValueError("--private and --revision apply to an upload: add --push-to-hub USER/NAME, or drop them.")
    if job.dual_chunk_config:
        check_dual_chunk_config(job.config.method)
    if job.serve_check:  # the engine and its flags, before the load, the evaluations and the save
        check_engine_flags(job.serve_check, job.engine_python)
        if _saved_natively(job.config.method):  # (a checkpoint no engine computes is reported without one)
            engine_ready(job.serve_check, job.engine_python)
    return evals


def _evaluations(job: PatchJob, config: PosEncConfig, evals: list, docs: list, loaded: tuple) -> list[dict]:
    """The reports of ``--eval``'s tasks, each of the unpatched model beside the patched one (and ``tune``'s first,
    when the job comes from it)."""
    lm, given = loaded[0], job.evals
    lengths = _lengths_of(lm, config, evals, given.lengths)
    methods = ["none", config] if config.method != "none" else ["none"]
    common = RunSettings(LoadSettings(job.load.model, job.load.dtype, job.load.device), methods=methods,
                         factor=config.factor, seed=job.seed,
                         output=OutputSettings(progress=job.progress, plots=False, command=job.command),
                         loaded=loaded)
    reports = []
    for task, arguments in evals:
        settings = PatchEval(lengths=lengths[task.name], docs=docs, arguments=arguments, depths=given.depths or [0.5],
                             trials=given.trials, max_windows=given.max_windows, limit=given.harness_limit,
                             max_gen_tokens=given.max_gen_tokens)
        reports.append(task.run(common, task.patch.params_of(settings)))
    if job.tuned is not None:
        reports.insert(0, job.tuned)
    return reports


def _dual_chunk(model, wanted: bool):
    """While the checkpoint is saved: Qwen's dual_chunk_attention_config on its config (``--dual-chunk-config``)."""
    return written_with_block(model) if wanted else nullcontext()


def _saved_natively(method: str) -> bool:
    """Whether a checkpoint of ``method`` is saved in fields engines read (the serve-check then starts the engine):
    not the attention-level methods, the swaps, nor a scaling transformers has no type for (dynamic_yarn)."""
    spec = resolve_method(method)
    return spec.kind not in ("attention", "swap") and not (spec.name in SCALINGS and SCALINGS[spec.name].native is None)

