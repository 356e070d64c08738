"""Publish patched checkpoints: save them complete (weights, tokenizer, config, model card, evaluation
reports) and upload them to the Hugging Face Hub.

The upload goes through ``huggingface_hub`` (``create_repo``, ``create_branch``, ``create_commit``),
which honours ``HF_TOKEN`` and ``HF_ENDPOINT``. The local save always completes before anything is
sent, so a failed or interrupted upload leaves a folder that ``hf-posenc upload`` can send again; the
token is never written to the card, the saved files, logs or error messages.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from contextlib import contextmanager
from typing import Any

from ..checkpoints.context import context_length
from ..checkpoints.models import drop_gguf_quantizer
from ..io.files import atomic_write_text, follow_umask
from ..io.interrupts import sigterm_interrupts
from ..io.output_folder import OWN
from ..io.provenance import scrub
from ..io.reports import save_report
from ..patching import holder
from .card import BaseModel, build_model_card, describe_base
from .legacy_folder import add_to_folder, folder_state, requested

EVAL_FOLDER = "hf_posenc_eval"  # where the full evaluation reports go inside a saved checkpoint
UPLOAD_TIMEOUT = 60.0  # seconds without an answer before one Hub request of an upload gives up


class UploadError(RuntimeError):
    """The upload failed; the local save named in the message is complete."""


def _base(model, base_model: str | BaseModel | None) -> BaseModel:
    if isinstance(base_model, BaseModel):
        return base_model
    name = base_model or getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    if not name:
        return BaseModel()
    try:
        return describe_base(name)
    except ValueError:
        return BaseModel(base_model)


def save_pretrained(model, save_directory: str, tokenizer=None, *, eval_results: list[dict[str, Any]] | None = None,
                    base_model: str | BaseModel | None = None, repo_id: str | None = None, command: str | None = None,
                    model_name: str | None = None, trained: bool = False, transformers4: bool | None = None,
                    **save_kwargs: Any) -> str:
    """Save a patched ``model`` so that it loads back exactly.

    Writes the weights and ``config.json`` (with the ``hf_posenc`` block), the tokenizer if given, ``README.md``
    (the model card) and the evaluation reports (JSON and Markdown) under ``hf_posenc_eval/``. A peft model is
    refused (peft would save its adapter alone): ``hf_posenc.training.lora.save_lora`` saves it.

    Args:
        model: the patched model.
        save_directory: the folder to write.
        tokenizer: saved beside the model when given.
        eval_results: reports returned by ``hf_posenc.eval`` runs or a fine-tune, for the card and the folder.
        base_model: the base model's Hub id, local path or alias (the card's ``base_model`` and license; default:
            where the model was loaded from).
        repo_id: the Hub repository the card names.
        command: the command line the card records.
        model_name: the card's title.
        trained: the weights were fine-tuned (the card says so).
        transformers4: ``config.json``'s RoPE also in transformers 4's keys (``rope_theta``, ``rope_scaling``;
            :mod:`hf_posenc.checkpoints.legacy_rope`): None writes them where transformers 4.57 computes the same
            RoPE from them (else the card and the hf_posenc block say why not), True refuses a RoPE it would
            compute otherwise, False writes none.
        **save_kwargs: passed to the model's own ``save_pretrained``.

    Returns:
        ``save_directory``.
    """
    if holder(model) is not model:
        raise ValueError(f"hf_posenc.save_pretrained saves a whole model, and this is a peft model "
                         f"({type(model).__name__}): save it with hf_posenc.training.lora.save_lora(model, folder, "
                         "merged=True) (one checkpoint) or merged=False (the adapter beside the patched base; "
                         "hf_posenc.from_pretrained loads either)")
    legacy = requested(model, transformers4)
    card = build_model_card(model, repo_id=repo_id, base=_base(model, base_model), eval_reports=eval_results,
                            command=command, model_name=model_name, trained=trained, transformers4=legacy)
    drop_gguf_quantizer(model)
    os.makedirs(save_directory, exist_ok=True)
    model.save_pretrained(save_directory, **save_kwargs)
    add_to_folder(save_directory, transformers4)
    if tokenizer is not None:
        save_tokenizer(tokenizer, save_directory, context_length(model))
    _write_card(save_directory, card, eval_results)
    return save_directory


def write_model_card(model, save_directory: str, *, eval_results: list[dict[str, Any]] | None = None,
                     base_model: str | BaseModel | None = None, repo_id: str | None = None, command: str | None = None,
                     model_name: str | None = None, trained: bool = False,
                     serve_check: dict[str, Any] | None = None, adapter: bool = False) -> None:
    """(Re)write the model card and the evaluation reports of a checkpoint :func:`save_pretrained` saved, e.g. once
    a serve-check of the saved folder (``serve_check``, its report) has measured what an engine computes;
    ``adapter``: the card of a LoRA adapter folder, ``model`` its patched base (:func:`build_model_card`)."""
    card = build_model_card(model, repo_id=repo_id, base=_base(model, base_model), eval_reports=eval_results,
                            command=command, model_name=model_name, trained=trained, serve_check=serve_check,
                            adapter=adapter, transformers4=folder_state(save_directory))
    _write_card(save_directory, card, eval_results)


def _write_card(save_directory: str, card, eval_results: list[dict[str, Any]] | None) -> None:
    for report in eval_results or []:  # JSON and Markdown table; plots stay where the run wrote them
        save_report({k: v for k, v in report.items() if k != "plots"}, os.path.join(save_directory, EVAL_FOLDER),
                    report["task"])
    atomic_write_text(os.path.join(save_directory, "README.md"), card.content)
    follow_umask(save_directory)


def save_tokenizer(tokenizer, save_directory: str, length: int | None) -> None:
    """Save ``tokenizer`` with ``model_max_length`` raised to ``length`` when it is lower (a BERT tokenizer
    says 512: left so, truncation would undo the extension); the tokenizer object itself is left as it was."""
    old = getattr(tokenizer, "model_max_length", None)
    raise_it = length is not None and old is not None and old < length
    if raise_it:
        tokenizer.model_max_length = length
    try:
        tokenizer.save_pretrained(save_directory)
    finally:
        if raise_it:
            tokenizer.model_max_length = old


@contextmanager
def _hub_timeout(seconds: float):
    """Give every request of ``huggingface_hub``'s shared HTTP client ``seconds`` to connect and to answer
    (its default is to wait forever); the client's own timeout is put back afterwards."""
    import httpx2
    from huggingface_hub.utils import get_session

    session = get_session()
    before = session.timeout
    session.timeout = httpx2.Timeout(seconds)
    try:
        yield
    finally:
        session.timeout = before


def upload(folder: str, repo_id: str, *, private: bool | None = None, revision: str | None = None,
           commit_message: str | None = None, token: str | None = None, endpoint: str | None = None,
           timeout: float = UPLOAD_TIMEOUT) -> str:
    """Upload a saved folder to the Hub repo ``repo_id`` (created if missing; ``revision``: a branch,
    created from main if missing). Returns the commit URL. Raises :class:`UploadError` on failure, and when
    a request gets no answer within ``timeout`` seconds. Interrupted (Ctrl-C, SIGTERM), it prints the
    command that uploads the folder again, then re-raises ``KeyboardInterrupt``."""
    from huggingface_hub import CommitOperationAdd, HfApi

    if not os.path.isdir(folder):
        raise ValueError(f"no saved checkpoint to upload at {folder}")
    if not isinstance(repo_id, str) or repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise ValueError(f"repo_id must look like 'user/name' (or 'name'), got {repo_id!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    files = sorted(rel for root, _, names in os.walk(folder) for rel in (os.path.relpath(os.path.join(root, f), folder)
                                                                          for f in names) if rel not in OWN)
    rerun = shlex.join(["hf-posenc", "upload", folder, repo_id] + (["--revision", revision] if revision else []))
    api = HfApi(endpoint=endpoint, token=token)
    try:
        with sigterm_interrupts(), _hub_timeout(timeout):
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision and revision != "main":
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            ops = [CommitOperationAdd(path_in_repo=rel.replace(os.sep, "/"), path_or_fileobj=os.path.join(folder, rel))
                   for rel in files]
            info = api.create_commit(repo_id, ops, commit_message=commit_message or "Upload model patched by hf_posenc",
                                     revision=revision)
    except KeyboardInterrupt:
        print(f"hf-posenc: upload interrupted; the local save in {folder} is complete. Rerun: {rerun}", file=sys.stderr)
        raise
    except Exception as err:  # network, auth, server, timeout: one clear line, never the token
        detail = " ".join(x.strip() for x in scrub(f"{type(err).__name__}: {err}", token).splitlines() if x.strip())
        if "timeout" in type(err).__name__.lower() or "timed out" in detail.lower():
            detail += f"; no answer within {timeout:g} s"
        raise UploadError(f"upload of {folder} to {repo_id} failed ({detail}). "
                          f"The local save in {folder} is complete; rerun: {rerun}") from None
    return str(info.commit_url)


def push_to_hub(model, repo_id: str, tokenizer=None, *, private: bool | None = None, revision: str | None = None,
                commit_message: str | None = None, token: str | None = None, endpoint: str | None = None,
                local_dir: str | None = None, timeout: float = UPLOAD_TIMEOUT, **save_kwargs: Any) -> str:
    """Save ``model`` like :func:`save_pretrained`, then upload the folder to the Hub (see :func:`upload`).

    Args:
        model: the patched model.
        repo_id: the Hub repository (``user/name``), created when missing.
        tokenizer: saved and uploaded beside the model when given.
        private: create the repository private.
        revision: the branch to upload to.
        commit_message: the commit's message.
        token: the Hub token (default: the stored login); never written to any output.
        endpoint: the Hub's address (default: huggingface.co or ``HF_ENDPOINT``).
        local_dir: where the folder is saved first (default: a new temporary folder, kept).
        timeout: seconds without an answer before one Hub request gives up.
        **save_kwargs: :func:`save_pretrained`'s keywords (``eval_results``, ``base_model``, ``command``, ...).

    Returns:
        The commit's URL.
    """
    folder = local_dir or tempfile.mkdtemp(prefix="hf_posenc-")
    save_pretrained(model, folder, tokenizer, repo_id=repo_id, **save_kwargs)
    return upload(folder, repo_id, private=private, revision=revision, commit_message=commit_message, token=token,
                  endpoint=endpoint, timeout=timeout)
