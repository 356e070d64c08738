"""``hf-posenc patch``: load a model, patch it, optionally evaluate it against the unpatched model, save
it complete with its model card, and optionally upload it."""

from __future__ import annotations

import os
from typing import Any

from .config import PosEncConfig
from .files import StagedFolder, check_output_folder
from .models import resolve_source


def default_eval_lengths(original: int, factor: float | None) -> list[int]:
    """Evaluate where it matters: the original context and the extended one."""
    extended = int(original * (factor or 1.0))
    return sorted({original, extended})


def split_evals(evals: list[str] | None) -> tuple[list[str], list[str]]:
    """``["ppl", "harness:vt", "harness:cwe"]`` -> (["ppl"], ["vt", "cwe"]); unknown names refused."""
    evals = list(evals or [])
    harness = [e.split(":", 1)[1].strip() for e in evals if e.startswith("harness:")]
    plain = [e for e in evals if not e.startswith("harness:")]
    unknown = sorted(set(plain) - {"ppl", "passkey", "retrieval"}) + [f"harness:{t}" for t in harness if not t]
    if unknown:
        raise ValueError(f"--eval takes ppl, passkey (decoders), retrieval (encoders) and harness:TASK (an lm-eval "
                         f"task, e.g. harness:niah_single_1), got {unknown}")
    if harness:
        from .eval.harness import check_tasks

        harness = check_tasks(harness)  # before the slow load
    return plain, harness


def _default_lengths(lm, config: PosEncConfig, evals: list[str], harness_tasks: list[str], ppl_lengths, passkey_lengths,
                     harness_lengths) -> list[int] | None:
    """The evaluation lengths around the model's context (None where every evaluation has its own lengths)."""
    from .context import original_context

    original = original_context(lm)
    unsized = (({"ppl", "retrieval"} & set(evals) and not ppl_lengths) or ("passkey" in evals and not passkey_lengths)
               or (harness_tasks and not harness_lengths))
    if original is None and unsized:  # T5: relative buckets, no context length to evaluate around
        raise ValueError(f"{type(lm).__name__} has no fixed context length to evaluate around; pass "
                         "--ppl-lengths / --passkey-lengths / --harness-lengths")
    return default_eval_lengths(original, config.factor) if original is not None else None


def _eval_reports(evals: list[str], harness_tasks: list[str], common: dict[str, Any], *, docs: list,
                  ppl_lengths: list[int], passkey_lengths: list[int], harness_lengths: list[int], max_windows: int,
                  depths: list[float], trials: int, harness_limit: int | None,
                  max_gen_tokens: int | None) -> list[dict[str, Any]]:
    """The reports of the evaluations asked for, each of the unpatched model beside the patched one."""
    reports = []
    if "ppl" in evals:
        from .eval.run_ppl import run_perplexity

        reports.append(run_perplexity(lengths=ppl_lengths, docs=docs, max_windows=max_windows, **common))
    if "passkey" in evals:
        from .eval.run_passkey import run_passkey

        reports.append(run_passkey(lengths=passkey_lengths, depths=depths, trials=trials, **common))
    if "retrieval" in evals:
        from .eval.run_retrieval import run_retrieval

        reports.append(run_retrieval(lengths=ppl_lengths, docs=docs, depths=depths, trials=trials, **common))
    if harness_tasks:
        from .eval.run_harness import run_harness

        reports.append(run_harness(tasks=harness_tasks, lengths=harness_lengths, limit=harness_limit,
                                   max_gen_tokens=max_gen_tokens, **common))
    return reports


def patch_and_save(*, model: str, config: PosEncConfig, output: str, evals: list[str] | None = None,
                   ppl_lengths: list[int] | None = None, passkey_lengths: list[int] | None = None,
                   text_file: list[str] | None = None, encoding: str = "utf-8", max_windows: int = 1,
                   depths: list[float] | None = None,
                   trials: int = 2, seed: int = 0, dtype: str = "float32", device: str = "cpu",
                   push_to_hub: str | None = None, private: bool | None = None, revision: str | None = None,
                   commit_message: str | None = None, command: str | None = None, progress: bool = True,
                   timeout: float | None = None, tokenizer: str | None = None,
                   harness_lengths: list[int] | None = None, harness_limit: int | None = 50,
                   max_gen_tokens: int | None = None, tuned: dict[str, Any] | None = None,
                   serve_check: str | None = None, engine_python: str | None = None,
                   serve_check_lengths: list[int] | None = None) -> dict[str, Any]:
    """The whole ``hf-posenc patch`` job; returns what was done (folder, reports, commit URL). ``evals``: ppl,
    passkey, retrieval and ``harness:TASK`` (an lm-eval task, e.g. ``harness:niah_single_1``; repeatable).
    ``tuned``: the report of the ``hf-posenc tune`` run that chose ``config`` (its table goes into the card).
    ``serve_check``: an engine (``vllm``) that the saved folder is checked in (:mod:`hf_posenc.serve_check`, at
    ``serve_check_lengths``, with ``engine_python``) before it is moved into place; its verdicts go into the card's
    Serving section and its report beside the others."""
    from . import runtime
    from .eval.data import gather_documents
    from .hub import UPLOAD_TIMEOUT, save_pretrained, upload
    from .patching import patch

    evals, harness_tasks = split_evals(evals)
    if harness_tasks and harness_lengths:
        from .eval.harness import check_lengths

        check_lengths(harness_lengths, harness_tasks)
    check_output_folder(output, resolve_source(model).path)  # before any compute
    if (private or revision) and not push_to_hub:
        raise ValueError("--private and --revision apply to an upload: add --push-to-hub USER/NAME, or drop them.")
    docs = gather_documents(text_file=text_file, encoding=encoding) if {"ppl", "retrieval"} & set(evals) else []
    lm, tok, src = runtime.load_model_and_tokenizer(model, dtype, device, tokenizer=tokenizer,
                                                    need_tokenizer=bool(evals or harness_tasks))
    lengths = _default_lengths(lm, config, evals, harness_tasks, ppl_lengths, passkey_lengths, harness_lengths)
    methods = ["none", config] if config.method != "none" else ["none"]
    common = dict(model=model, methods=methods, factor=config.factor, method_params={}, seed=seed, dtype=dtype,
                  device=device, progress=progress, plots=False, loaded=(lm, tok, src), command=command)
    reports = _eval_reports(evals, harness_tasks, common, docs=docs, ppl_lengths=ppl_lengths or lengths,
                            passkey_lengths=passkey_lengths or lengths, harness_lengths=harness_lengths or lengths,
                            max_windows=max_windows, depths=depths or [0.5], trials=trials, harness_limit=harness_limit,
                            max_gen_tokens=max_gen_tokens)
    if tuned is not None:
        reports.insert(0, tuned)
    patch(lm, config)
    card = dict(base_model=model, repo_id=push_to_hub, command=command)
    with StagedFolder(output) as staged:  # a failure leaves --output as it was
        save_pretrained(lm, staged, tok, eval_results=reports, **card)
        if serve_check:
            from .hub import write_model_card
            from .serve_check import serve_check as check_folder, serve_table

            check = check_folder(staged, engine=serve_check, engine_python=engine_python, lengths=serve_check_lengths,
                                 tokenizer=tokenizer, dtype=dtype, progress=progress, command=command)
            check["setup"]["folder"] = os.path.abspath(output)  # where it will be, not the staging folder
            check["table"] = serve_table(check)
            reports.append(check)
            write_model_card(lm, staged, eval_results=reports, serve_check=check, **card)
    done: dict[str, Any] = {"output": output, "reports": reports, "commit_url": None, "tokenizer_saved": tok is not None}
    if push_to_hub:
        done["commit_url"] = upload(output, push_to_hub, private=private, revision=revision,
                                    commit_message=commit_message, timeout=timeout or UPLOAD_TIMEOUT)
    return done
