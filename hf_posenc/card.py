"""Model cards for patched checkpoints: what changed, how to load it, how it was made, what it measured.

The card is rendered from the Jinja template in ``model_cards/`` (shipped inside the package as
``hf_posenc/model_cards`` in a wheel) with ``huggingface_hub.ModelCard``; its metadata
(``ModelCardData``) carries ``base_model``, ``library_name``, tags, the base model's license where it is
known, and the evaluation results as ``model-index`` entries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .provenance import environment, recorded_command, scrub
from .adapters import ADAPTERS
from .adapters.base import text_config
from .config import CONFIG_KEY

_HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_NAME = "model_card.md"



def pipeline_tag(model) -> str:
    if getattr(model.config, "is_encoder_decoder", False):
        return "text2text-generation"
    return "text-generation" if model.get_output_embeddings() is not None else "feature-extraction"


def template_path(name: str = TEMPLATE_NAME) -> str:
    """The card template: inside the installed package (wheel), else ``model_cards/`` of a checkout."""
    for folder in (os.path.join(_HERE, "model_cards"), os.path.join(os.path.dirname(_HERE), "model_cards")):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise ValueError(f"model card template {name!r} not found next to hf_posenc (a broken install?)")


@dataclass
class BaseModel:
    """What the card says of the model that was patched."""

    repo_id: str | None = None  # its Hub id, when known
    license: str | None = None


def _readme_metadata(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return {}
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(path).data.to_dict()
    except Exception:  # a README without (valid) metadata says nothing
        return {}


def _gguf_metadata(path: str) -> dict[str, Any]:
    try:
        from gguf import GGUFReader

        fields = GGUFReader(path).fields
    except Exception:
        return {}
    out = {}
    for key in ("general.license", "general.base_model.0.repo_url", "general.organization", "general.basename"):
        if key in fields:
            try:
                out[key] = fields[key].contents()
            except Exception:
                pass
    return out


# Hub ids of the built-in aliases (models.ALIASES)
ALIAS_REPOS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
               "all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
               "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct"}


def describe_base(name_or_path: str) -> BaseModel:
    """The base model's Hub id and license, from what is at hand: alias table, GGUF metadata, a local
    README's metadata, or (for a Hub id, best effort, never fatal) the Hub's model info."""
    from .models import resolve_source

    src = resolve_source(name_or_path)
    repo = ALIAS_REPOS.get(str(name_or_path).lower())
    facts: dict[str, Any] = {}
    if "gguf_file" in src.kwargs:
        meta = _gguf_metadata(os.path.join(src.path, src.kwargs["gguf_file"]))
        facts["license"] = meta.get("general.license")
        url = meta.get("general.base_model.0.repo_url")
        if not repo and isinstance(url, str) and "huggingface.co/" in url:
            repo = url.split("huggingface.co/", 1)[1].strip("/")
    elif os.path.isdir(src.path):
        meta = _readme_metadata(src.path)
        facts["license"] = meta.get("license")
        base = meta.get("base_model")
        if not repo and isinstance(base, str):
            repo = base  # a checkpoint hf_posenc saved: keep pointing at the true base
    else:
        repo = repo or src.path
        try:
            from huggingface_hub import model_info

            info = model_info(src.path, timeout=10)
            facts["license"] = (info.card_data or {}).get("license") if info.card_data else None
        except Exception:
            pass
    return BaseModel(repo, facts.get("license"))


# per evaluation task: (its number for one length of a method's results, what the model-index says of it)
_METRICS = {
    "perplexity": (lambda res, n: (res.get(n) or {}).get("ppl"),
                   dict(task_type="text-generation", task_name="Long-context language modeling", dataset_type="text",
                        metric_type="perplexity"), "perplexity @ {n} tokens"),
    "passkey": (lambda res, n: res["by_length"].get(n),
                dict(task_type="text-generation", task_name="Passkey retrieval", dataset_type="passkey",
                     dataset_name="synthetic passkey retrieval", metric_type="accuracy"),
                "passkey accuracy @ {n} tokens"),
    "retrieval": (lambda res, n: (res["by_length"].get(n) or {}).get("accuracy"),
                  dict(task_type="sentence-similarity", task_name="Long-document needle retrieval",
                       dataset_type="needle-retrieval", dataset_name="synthetic needle retrieval",
                       metric_type="accuracy"), "needle retrieval top-1 @ {n} tokens"),
}


def _harness_entries(report: dict[str, Any], res: dict[str, Any]) -> list[tuple[dict[str, Any], str, float, str]]:
    """lm-eval scores: one entry per task and length (RULER's tasks are synthetic: the dataset is the task)."""
    version = report["setup"]["lm_eval"]
    out = []
    for task, by_length in res["scores"].items():
        fields = dict(task_type="text-generation", task_name=f"lm-eval {task}", dataset_type=task,
                      dataset_name=f"{task} (lm-evaluation-harness {version})", metric_type="score")
        out += [(fields, f"{task} @ {n} tokens", value, n) for n, value in by_length.items()]
    return out


def _length_entries(task: str):
    """The entries of a task with one number per length (``_METRICS``)."""
    value_of, fields, name = _METRICS[task]

    def entries(report: dict[str, Any], res: dict[str, Any]) -> list[tuple[dict[str, Any], str, float, str]]:
        labelled = {"dataset_name": _dataset_label(report["setup"].get("documents", [])), **fields}
        values = [(str(n), value_of(res, str(n))) for n in report["setup"]["lengths"]]
        return [(labelled, name.format(n=n), v, n) for n, v in values if v is not None]

    return entries


# per report task: (model-index fields, metric name, value, metric config) of its numbers for one method;
# reports of other tasks (a fine-tune's, tune's) are tables in the card's body only
_ENTRIES = {**{task: _length_entries(task) for task in _METRICS}, "harness": _harness_entries}


def eval_results(reports: list[dict[str, Any]], method: str) -> list:
    """``model-index`` entries (``EvalResult``) for ``method``'s numbers in hf_posenc evaluation reports."""
    from huggingface_hub import EvalResult

    out = []
    for report in reports:
        entries = _ENTRIES.get(report["task"])
        res = report["results"].get(method) if entries is not None else None
        if res is None:
            continue
        out += [EvalResult(**fields, metric_name=name, metric_value=round(float(value), 4), metric_config=config)
                for fields, name, value, config in entries(report, res)]
    return out


def _dataset_label(docs: list[str]) -> str:
    if not docs:
        return "text"
    shown = ", ".join(docs[:3]) + (f" and {len(docs) - 3} more" if len(docs) > 3 else "")
    return shown


def _eval_sections(reports: list[dict[str, Any]]) -> list[dict[str, str]]:
    titles = {"perplexity": "Perplexity", "passkey": "Passkey retrieval", "retrieval": "Needle retrieval",
              "harness": "lm-evaluation-harness (RULER)", "tune": "How this configuration was chosen (hf-posenc tune)",
              "finetune": "Fine-tuning (held-out perplexity before and after)",
              "serve_check": "Served by an engine (hf-posenc serve-check)"}
    return [{"title": titles.get(r["task"], r["task"]), "table": r["table"], "command": r["setup"].get("command")}
            for r in reports]


def holds_patch(block: dict[str, Any]) -> bool:
    """Whether the saved weights hold the change (a resized or replaced position table), so that plain transformers
    builds the original architecture around other weights."""
    adapter = next((a for a in ADAPTERS if a.name == block.get("family")), None)
    return adapter is not None and not adapter.restores(block)


def build_model_card(model, *, repo_id: str | None = None, base: BaseModel | None = None,
                     eval_reports: list[dict[str, Any]] | None = None, command: str | None = None,
                     model_name: str | None = None, trained: bool = False, extra_tags: list[str] | None = None,
                     serve_check: dict[str, Any] | None = None):
    """The ``huggingface_hub.ModelCard`` of a patched ``model``; ``serve_check``: the report of a serve-check of the
    saved checkpoint, whose measured verdicts replace the known status of that engine in the Serving section."""
    from huggingface_hub import ModelCard, ModelCardData

    from .methods import resolve_method
    from .patching import get_config
    from .serving import known_status, measured_rows

    cfg = get_config(model)
    if cfg is None:
        raise ValueError("the model is not patched by hf_posenc: patch it first (hf_posenc.patch(model, ...)); "
                         "use method 'none' to publish it unchanged.")
    block = getattr(model.config, CONFIG_KEY)
    base = base or BaseModel()
    reports = list(eval_reports or [])
    name = model_name or (repo_id.split("/")[-1] if repo_id else f"{(base.repo_id or 'model').split('/')[-1]}-{cfg.method}")
    tags = ["hf_posenc", cfg.method.replace("_", "-"), "long-context", *(extra_tags or [])]
    results = eval_results(reports, cfg.method)
    data = ModelCardData(
        base_model=base.repo_id, library_name="transformers", license=base.license,
        tags=list(dict.fromkeys(tags)), model_name=name if results else None, eval_results=results or None,
        pipeline_tag=pipeline_tag(model),
    )
    auto_class = type(model).__name__  # the class transformers builds it with (LlamaForCausalLM, BertModel, ...)
    lm_config, prefix = text_config(model.config)
    original = (cfg.original_max_position_embeddings
                or block.get("original", {}).get(prefix + "max_position_embeddings"))
    card = ModelCard.from_template(
        data, template_path=template_path(),
        model_name=name, repo_id=repo_id or f"path/to/{name}", base_model=base.repo_id,
        method=cfg.method, method_summary=resolve_method(cfg.method).summary, factor=cfg.factor,
        params={k: v for k, v in cfg.params.items() if v is not None},
        original_context=original, new_context=getattr(lm_config, "max_position_embeddings", None),
        family=block.get("family"), native=bool(block.get("native")),
        rope_parameters=getattr(lm_config, "rope_parameters", None),
        changes_weights=holds_patch(block), trained=trained, auto_class=auto_class,
        command=recorded_command(command), environment=environment(), eval_sections=_eval_sections(reports),
        in_model_index=bool(results), serving=measured_rows(known_status(block), serve_check),
    )
    card.content = scrub(card.content)  # the commands it quotes (the card's own and its reports') carry no secret
    return card
