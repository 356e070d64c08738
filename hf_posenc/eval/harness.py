"""lm-evaluation-harness on a patched model: RULER's synthetic tasks (and any other lm-eval task) per length.

A patched model -- including methods plain transformers cannot load (``self_extend``, ``dca``,
``dynamic_yarn``, ``alibi``, ...) -- is handed to lm-eval as the instance it is
(``lm_eval.models.huggingface.HFLM(pretrained=model, tokenizer=...)``), so the harness measures exactly the
model hf_posenc built. One cell is one lm-eval task at one length: RULER's tasks generate their prompts
locally from the tokenizer, sized to the length (``metadata={"max_seq_lengths": [length]}``); the score of a
RULER task at a length is lm-eval's ``"<length>,none"`` metric (the share of expected strings found in the
answer, 0..1). Other tasks report their first metric, with the length as the model's ``max_length``.

Effective length (RULER, Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?"): the longest tested length up to which the mean score over the tasks stays at or above a threshold,
by default 0.856 (Llama-2-7B's score at 4K, the threshold RULER uses); a length beyond the first failure does not
count. ``None`` when the model fails already at the shortest length.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import logging
import os
import tempfile
from importlib.metadata import version
from typing import Any

import torch

from ..engines.scorer import Scorer
from .passkey import stop_tokens
from .scoring import served

RULER_THRESHOLD = 0.856
LOCAL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe",
               "ruler_fwe")  # no download
SHORT_NAMES = {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe", "qa_squad": "ruler_qa_squad",
               "qa_hotpot": "ruler_qa_hotpot"}  # RULER's own names, as lm-eval prefixes them
MIN_LENGTH = 256  # RULER keeps 128 tokens of each length for the answer
TASK_MIN_LENGTH = {"ruler_vt": 1024, "ruler_cwe": 1024}  # shorter, lm-eval's builders loop forever or divide by 0
OUTPUTS_KEPT = 5  # answers kept per cell in the report, to see what the model said


def require_lm_eval() -> str:
    """lm-eval's version; a clear error when the optional extra is not installed."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401
    except ImportError as err:
        raise ValueError(f"the harness needs lm-evaluation-harness ({err}); install it with "
                         "pip install 'hf_posenc[harness]' (lm-eval with its RULER extras)") from None

    return version("lm_eval")


@functools.lru_cache(maxsize=1)
def _every_task():
    """lm-eval's TaskManager over every task it ships (its index: each name and the file defining it), built once
    per process: reading its ~14,000 YAML files takes ~20 s on 2 cores."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


@functools.lru_cache(maxsize=8)
def _task_manager(metadata: str, task: str):
    """A TaskManager that loads ``task`` with ``metadata`` (RULER's length and tokenizer): over the folder that
    defines the task only (its index read from :func:`_every_task`, not again per metadata), else over every task."""
    from lm_eval.tasks import TaskManager

    entry = _every_task().task_index.get(task)
    defined_in = getattr(entry, "yaml_path", None)
    if defined_in is None:  # a tag, or a task defined in Python only
        return TaskManager(metadata=json.loads(metadata))
    return TaskManager(include_defaults=False, include_path=os.path.dirname(str(defined_in)),
                       metadata=json.loads(metadata))


def check_tasks(tasks: list[str]) -> list[str]:
    """lm-eval's names of ``tasks`` (tasks, groups or tags; RULER's short names such as ``vt`` become
    ``ruler_vt``); an error naming any lm-eval does not know."""
    if not tasks:
        raise ValueError("--tasks needs at least one lm-eval task, e.g. niah_single_1,niah_multikey_2,ruler_vt")
    require_lm_eval()
    known = set(_every_task().all_tasks)
    tasks = [SHORT_NAMES.get(t, t) if t not in known else t for t in tasks]
    for name in tasks:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
            hint = f" Did you mean {', '.join(near)}?" if near else ""
            raise ValueError(f"lm-eval has no task, group or tag {name!r}.{hint} RULER tasks that need no download: "
                             f"{', '.join(LOCAL_TASKS)}")
    return tasks


def check_lengths(lengths: list[int], tasks: list[str] = ()) -> list[int]:
    short = [n for n in lengths if n < MIN_LENGTH]
    if short:
        raise ValueError(f"harness lengths must be >= {MIN_LENGTH} tokens (RULER keeps 128 of them for the answer), "
                         f"got {short}")
    for task in tasks:
        least = TASK_MIN_LENGTH.get(task, 0)
        if min(lengths) < least:
            raise ValueError(f"{task} builds its prompts for lengths of {least} tokens and more (lm-eval's builder "
                             f"does not finish below), got {min(lengths)}")
    return lengths


def check_tokenizer(tokenizer) -> None:
    """lm-eval's generation stops at the tokenizer's end-of-sequence token: one without it is refused."""
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError(f"lm-eval generates until the end-of-sequence token, and the tokenizer "
                         f"{getattr(tokenizer, 'name_or_path', '')!r} has none (an encoder's?); the harness runs "
                         "decoders with their own tokenizer (--tokenizer)")


def saved_tokenizer(tokenizer, folder: str) -> str:
    """RULER sizes its prompts with a tokenizer it loads by name: the run's tokenizer, saved in ``folder``."""
    check_tokenizer(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def _one_process_and_quiet():
    """lm-eval sees one process (hf_posenc shares the cells between processes itself; under torchrun lm-eval
    would otherwise return nothing on ranks > 0) and logs only errors."""
    old_rank, logger = os.environ.get("LOCAL_RANK"), logging.getLogger("lm_eval")
    old_level = logger.level
    os.environ["LOCAL_RANK"] = "0"
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old_level)
        if old_rank is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = old_rank


def _score(result: dict[str, Any], length: int, higher_is_better: dict[str, bool]) -> tuple[str, float]:
    """(metric, value) of one task's results: RULER's ``<length>`` metric, else the task's first metric."""
    ruler = result.get(f"{length},none")
    if isinstance(ruler, (int, float)) and ruler != -1:
        return str(length), float(ruler)
    for metric in higher_is_better:
        for key, value in result.items():
            if key.split(",")[0] == metric and isinstance(value, (int, float)):
                return metric, float(value)
    raise ValueError(f"lm-eval gave no score at length {length}: {sorted(result)}")


def _outputs(samples: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    out = []
    for s in samples[:OUTPUTS_KEPT]:
        resp = s.get("filtered_resps")
        out.append({"doc_id": s.get("doc_id"), "target": s.get("target"),
                    "output": resp[0] if isinstance(resp, list) and resp else resp, "score": s.get(metric)})
    return out


def engine_hflm(HFLM):
    """lm-eval's ``HFLM`` whose greedy generation is answered by a serving engine (a :class:`engines.scorer.Scorer`):
    prompts are built, truncated, cut at the stop sequences and decoded exactly as for the model itself; only the tokens
    come from the engine. Log-likelihood requests (which need every logit) are refused: RULER's tasks generate."""

    class EngineHFLM(HFLM):
        def __init__(self, served: Scorer, **kwargs):
            super().__init__(**kwargs)
            self.served = served

        def _model_generate(self, context, attention_mask, stop, max_length, **kwargs):
            new, eos = max_length - context.shape[1], stop_tokens(self.served.generation_config, self.tokenizer)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
            rows = [torch.cat([ids.cpu(), torch.tensor(self.served.greedy(ids[mask.bool()][None], new, eos)[0],
                                                        dtype=ids.dtype)])
                    for ids, mask in zip(context, attention_mask)]
            width = max(len(r) for r in rows)
            return torch.stack([torch.cat([r, r.new_full((width - len(r),), pad)]) for r in rows])

        def _loglikelihood_tokens(self, *args, **kwargs):
            raise ValueError("--engine vllm answers lm-eval's generation tasks (RULER's); a log-likelihood task needs "
                             "every logit: run it with --engine transformers")

    return EngineHFLM


def harness_cell(model, tokenizer, tokenizer_dir: str, task: str, length: int, *, limit: int | None = None,
                 max_gen_tokens: int | None = None, batch_size: int = 1, seed: int = 0) -> dict[str, Any]:
    """One lm-eval task (or group) at one length on ``model`` as it is: per leaf task its score, metric,
    sample count and the first answers."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    gen = max_gen_tokens or 128
    metadata = json.dumps({"max_seq_lengths": [length], "tokenizer": tokenizer_dir}, sort_keys=True)
    with _one_process_and_quiet():
        try:
            if served(model):  # served by an engine: lm-eval's HFLM, its generation answered there
                lm = engine_hflm(HFLM)(model, pretrained=model.hf_model, tokenizer=tokenizer, max_length=length + gen,
                                       batch_size=batch_size)
            else:
                lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=length + gen, batch_size=batch_size)
            res = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=limit,
                                          task_manager=_task_manager(metadata, task),
                                          gen_kwargs={"max_gen_toks": max_gen_tokens} if max_gen_tokens else None,
                                          log_samples=True, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
        except (OSError, ConnectionError) as err:  # a task whose data is downloaded, on a machine without network
            raise ValueError(f"lm-eval could not get the data of task {task!r} ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:300]}); offline, use the tasks that build their data "
                             f"locally: {', '.join(LOCAL_TASKS)}") from None
        except (ValueError, ArithmeticError, AssertionError, KeyError) as err:
            raise ValueError(f"lm-eval failed on task {task!r} at {length} tokens ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:300]})") from None
    cell: dict[str, Any] = {"scores": {}, "metrics": {}, "samples": {}, "outputs": {}}
    for name, samples in sorted(res["samples"].items()):
        metric, value = _score(res["results"][name], length, res["higher_is_better"].get(name, {}))
        cell["scores"][name], cell["metrics"][name] = value, metric
        cell["samples"][name], cell["outputs"][name] = len(samples), _outputs(samples, metric)
    return cell


def effective_length(mean_by_length: dict[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """The longest length up to which every tested length's mean score is >= ``threshold`` (None if the
    shortest already falls below)."""
    best = None
    for n in sorted(mean_by_length):
        if mean_by_length[n] < threshold:
            break
        best = n
    return best


def aggregate_harness(lengths: list[int], cells: list[tuple[str, int, dict]],
                      threshold: float = RULER_THRESHOLD) -> dict[str, Any]:
    """From (task, length, cell): score per leaf task and length, mean per length, effective length."""
    scores: dict[str, dict[str, float]] = {}
    metrics, samples, outputs = {}, {}, {}
    for _, n, cell in cells:
        for name, value in cell["scores"].items():
            scores.setdefault(name, {})[str(n)] = value
            metrics[name] = cell["metrics"][name]
            samples.setdefault(name, {})[str(n)] = cell["samples"][name]
            outputs.setdefault(name, {})[str(n)] = cell["outputs"][name]
    mean = {str(n): sum(s[str(n)] for s in scores.values() if str(n) in s) /
            max(1, sum(str(n) in s for s in scores.values())) for n in lengths}
    return {"scores": scores, "mean": mean, "metrics": metrics, "samples": samples, "outputs": outputs,
            "effective_length": effective_length({int(n): v for n, v in mean.items()}, threshold)}


def evaluate(model, tokenizer, tasks: list[str], lengths: list[int], *, limit: int | None = None,
             max_gen_tokens: int | None = None, batch_size: int = 1, seed: int = 0,
             threshold: float = RULER_THRESHOLD) -> dict[str, Any]:
    """lm-eval ``tasks`` at each of ``lengths`` on ``model`` as it is (patch it first), e.g.
    ``evaluate(hf_posenc.patch(model, "yarn", factor=2), tok, ["niah_single_1"], [4096, 8192], limit=20)``.
    Returns scores per task and length, the mean per length and the effective length. (``hf-posenc eval
    harness`` computes the same cells for several variants, resumably, see ``run_harness``.)"""
    tasks = check_tasks(tasks)
    check_lengths(lengths, tasks)
    with tempfile.TemporaryDirectory() as folder:
        where = saved_tokenizer(tokenizer, folder)
        cells = [(t, n, harness_cell(model, tokenizer, where, t, n, limit=limit, max_gen_tokens=max_gen_tokens,
                                     batch_size=batch_size, seed=seed)) for n in lengths for t in tasks]
    return aggregate_harness(lengths, cells, threshold)
