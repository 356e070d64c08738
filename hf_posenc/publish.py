"""``hf-posenc patch``: load a model, patch it, optionally evaluate it against the unpatched model, save
it complete with its model card, and optionally upload it."""

from __future__ import annotations

import os
from typing import Any

from .config import PosEncConfig
from .replaced_folder import ReplacedOutput, check_replaced_output
from .models import resolve_source


def default_eval_lengths(original: int, factor: float | None) -> list[int]:
    """Evaluate where it matters: the original context and the extended one."""
    extended = int(original * (factor or 1.0))
    return sorted({original, extended})


def _lengths_of(lm, config: PosEncConfig, evals, given: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each task's lengths: its ``--<lengths_flag>-lengths``, else the original context and the extended one."""
    from .context import original_context

    original = original_context(lm)
    unsized = sorted({task.patch.lengths_flag for task, _ in evals if not given.get(task.patch.lengths_flag)})
    if original is None and unsized:  # T5: relative buckets, no context length to evaluate around
        raise ValueError(f"{type(lm).__name__} has no fixed context length to evaluate around; pass "
                         + " / ".join(f"--{flag}-lengths" for flag in unsized))
    around = default_eval_lengths(original, config.factor) if original is not None else None
    return {task.name: given.get(task.patch.lengths_flag) or around for task, _ in evals}


def patch_and_save(*, model: str, config: PosEncConfig, output: str, evals: list[str] | None = None,
                   eval_lengths: dict[str, list[int]] | None = None, text_file: list[str] | None = None,
                   encoding: str = "utf-8", max_windows: int = 1, depths: list[float] | None = None,
                   trials: int = 2, seed: int = 0, dtype: str = "float32", device: str = "cpu",
                   push_to_hub: str | None = None, private: bool | None = None, revision: str | None = None,
                   commit_message: str | None = None, command: str | None = None, progress: bool = True,
                   timeout: float | None = None, tokenizer: str | None = None,
                   harness_limit: int | None = 50,
                   max_gen_tokens: int | None = None, tuned: dict[str, Any] | None = None,
                   serve_check: str | None = None, engine_python: str | None = None,
                   serve_check_lengths: list[int] | None = None, freeze_at: int | None = None,
                   dual_chunk_config: bool = False) -> dict[str, Any]:
    """The whole ``hf-posenc patch`` job; returns what was done (folder, reports, commit URL). ``evals``: names of
    registered eval tasks (:mod:`eval.tasks`: ppl, passkey, retrieval, ``harness:TASK`` with an lm-eval task, e.g.
    ``harness:niah_single_1``; repeatable); ``eval_lengths``: lengths by a task's ``lengths_flag`` ("ppl",
    "passkey", "harness"), default the original context and the extended one.
    ``tuned``: the report of the ``hf-posenc tune`` run that chose ``config`` (its table goes into the card).
    ``serve_check``: an engine (``vllm``) that the saved folder is checked in (:mod:`hf_posenc.serve_check`, at
    ``serve_check_lengths``, with ``engine_python``) before it is moved into place; its verdicts go into the card's
    Serving section and its report beside the others. ``freeze_at``: ``config`` (a length-dependent method) is
    replaced by the static one equal to it at that many tokens (:mod:`hf_posenc.freezing`), evaluated and saved.
    ``dual_chunk_config``: a DCA checkpoint of a Qwen2-family model also gets Qwen's ``dual_chunk_attention_config``
    (:mod:`hf_posenc.dual_chunk_config`)."""
    from . import runtime
    from .eval.data import gather_documents
    from .eval.settings import LoadSettings, OutputSettings, RunSettings
    from .eval.tasks import PatchEval, parse_evals
    from .hub import UPLOAD_TIMEOUT, save_pretrained, upload
    from .patching import patch

    evals = parse_evals(evals)  # before the slow load
    for task, arguments in evals:
        if task.patch.check_lengths and (eval_lengths or {}).get(task.patch.lengths_flag):
            task.patch.check_lengths(eval_lengths[task.patch.lengths_flag], arguments)
    check_replaced_output(output, "patch", resolve_source(model).path, text_file or [])  # before any compute
    if (private or revision) and not push_to_hub:
        raise ValueError("--private and --revision apply to an upload: add --push-to-hub USER/NAME, or drop them.")
    if dual_chunk_config:
        from .dual_chunk_config import check_dual_chunk_config

        check_dual_chunk_config(config.method)
    if serve_check:  # the engine and its flags, before the load, the evaluations and the save
        from .serve_check import check_engine_flags, engine_ready

        check_engine_flags(serve_check, engine_python)
        if _saved_natively(config.method):  # (a checkpoint no engine computes is reported without one)
            engine_ready(serve_check, engine_python)
    with ReplacedOutput(output, "patch") as out:  # one run per --output, from here to the save
        reads_documents = any(t.reads_documents for t, _ in evals)
        docs = gather_documents(text_file=text_file, encoding=encoding) if reads_documents else []
        lm, tok, src = runtime.load_model_and_tokenizer(model, dtype, device, tokenizer=tokenizer,
                                                        need_tokenizer=bool(evals))
        if freeze_at is not None:  # the static configuration, resolved against the model, is what follows
            from .freezing import freeze
            from .patching import get_config, unpatch

            config = get_config(freeze(lm, config, freeze_at))
            unpatch(lm)
        if dual_chunk_config:  # the family, once the model is loaded, before any evaluation
            check_dual_chunk_config("dca", getattr(lm.config, "model_type", None))
        lengths = _lengths_of(lm, config, evals, eval_lengths or {})
        methods = ["none", config] if config.method != "none" else ["none"]
        common = RunSettings(LoadSettings(model, dtype, device), methods=methods, factor=config.factor, seed=seed,
                             output=OutputSettings(progress=progress, plots=False, command=command),
                             loaded=(lm, tok, src))
        reports = []
        for task, arguments in evals:  # each of the unpatched model beside the patched one
            given = PatchEval(lengths=lengths[task.name], docs=docs, arguments=arguments, depths=depths or [0.5],
                              trials=trials, max_windows=max_windows, limit=harness_limit,
                              max_gen_tokens=max_gen_tokens)
            reports.append(task.run(common, task.patch.params_of(given)))
        if tuned is not None:
            reports.insert(0, tuned)
        patch(lm, config)
        card = dict(base_model=model, repo_id=push_to_hub, command=command)
        with out.staged() as staged, _dual_chunk(lm, dual_chunk_config):  # a failure leaves --output as it was
            save_pretrained(lm, staged, tok, eval_results=reports, **card)
            if serve_check:
                from .hub import write_model_card
                from .serve_check import CheckSettings, EngineSettings, serve_check as check_folder, serve_table

                check = check_folder(staged, EngineSettings(serve_check, engine_python),
                                     CheckSettings(serve_check_lengths, dtype=dtype), tokenizer=tokenizer,
                                     progress=progress, command=command)
                check["setup"]["folder"] = os.path.abspath(output)  # where it will be, not the staging folder
                check["table"] = serve_table(check)
                reports.append(check)
                write_model_card(lm, staged, eval_results=reports, serve_check=check, **card)
        done: dict[str, Any] = {"output": output, "reports": reports, "commit_url": None,
                                "tokenizer_saved": tok is not None}
        if push_to_hub:  # still under the lock: no other run replaces the folder while it is sent
            done["commit_url"] = upload(output, push_to_hub, private=private, revision=revision,
                                        commit_message=commit_message, timeout=timeout or UPLOAD_TIMEOUT)
    return done


def _dual_chunk(model, wanted: bool):
    """While the checkpoint is saved: Qwen's dual_chunk_attention_config on its config (``--dual-chunk-config``)."""
    from contextlib import nullcontext

    from .dual_chunk_config import written_with_block

    return written_with_block(model) if wanted else nullcontext()


def _saved_natively(method: str) -> bool:
    """Whether a checkpoint of ``method`` is saved in fields engines read (the serve-check then starts the engine):
    not the attention-level methods, the swaps, nor a scaling transformers has no type for (dynamic_yarn)."""
    from .methods import resolve_method
    from .methods.rope import SCALINGS

    spec = resolve_method(method)
    return spec.kind not in ("attention", "swap") and not (spec.name in SCALINGS and SCALINGS[spec.name].native is None)

