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

from ..adapters import ADAPTERS
from ..adapters.base import text_config
from ..adapters.remapped_layers import computed_layers, layers_note
from ..adapters.rope_compose import own_scaling
from ..checkpoints.legacy_rope import LegacyKeys
from ..checkpoints.loading import merge_line
from ..checkpoints.models import resolve_source
from ..config import CONFIG_KEY
from ..eval.tasks import registered, task_of_report
from ..io.provenance import environment, recorded_command, scrub
from ..methods import resolve_method
from ..patching import get_config
from ..serving.launch_settings import card_launches
from ..serving.support import known_status, measured_rows, with_launches
from .legacy_folder import card_line

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hf_posenc/
TEMPLATE_NAME = "model_card.md"



def pipeline_tag(model) -> str:
    if getattr(model.config, "is_encoder_decoder", False):
        return "text2text-generation"
    return "text-generation" if model.get_output_embeddings() is not None else "feature-extraction"


def template_path(name: str = TEMPLATE_NAME) -> str:
    """The card template: inside the installed package (wheel), else ``model_cards/`` of a checkout."""
    for folder in (os.path.join(_PACKAGE, "model_cards"), os.path.join(os.path.dirname(_PACKAGE), "model_cards")):
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


def eval_results(reports: list[dict[str, Any]], method: str) -> list:
    """``model-index`` entries (``EvalResult``) for ``method``'s numbers in hf_posenc evaluation reports."""
    from huggingface_hub import EvalResult

    out = []
    for report in reports:
        task = task_of_report(report["task"])  # reports of other jobs (tune, finetune) are tables in the body only
        res = report["results"].get(method) if task is not None and task.model_index is not None else None
        if res is None:
            continue
        out += [EvalResult(**fields, metric_name=name, metric_value=round(float(value), 4), metric_config=config)
                for fields, name, value, config in task.model_index(report, res)]
    return out


# the card's titles of the reports that are not eval tasks' (eval tasks name theirs: eval.tasks.EvalTask.title)
_OTHER_TITLES = {"tune": "How this configuration was chosen (hf-posenc tune)",
                 "finetune": "Fine-tuning (held-out perplexity and long context, before and after)",
                 "serve_check": "Served by an engine (hf-posenc serve-check)"}


def _eval_sections(reports: list[dict[str, Any]]) -> list[dict[str, str]]:
    titles = {**_OTHER_TITLES, **{t.report: t.title for t in registered().values()}}
    return [{"title": titles.get(r["task"], r["task"]), "table": r["table"], "command": r["setup"].get("command")}
            for r in reports]


def holds_patch(block: dict[str, Any]) -> bool:
    """Whether the saved weights hold the change (a resized or replaced position table), so that plain transformers
    builds the original architecture around other weights."""
    adapter = next((a for a in ADAPTERS if a.name == block.get("family")), None)
    return adapter is not None and not adapter.restores(block)


def _own_scaling(block: dict[str, Any], prefix: str, rope: dict[str, Any] | None) -> dict[str, Any]:
    """The scaling the checkpoint had before the patch, for the card (:func:`rope_compose.own_scaling`): its
    rope_type, pretraining context and the context it served when its RoPE was already scaled, and whether the patch
    replaced it."""
    own = own_scaling(block, prefix, rope)
    if own is None:
        return {"own_scaling": None, "pretrained_context": None, "own_context": None, "replaced": False}
    return {"own_scaling": own["rope_type"], "pretrained_context": own["pretrained_context"],
            "own_context": own["context"], "replaced": own["replaced"]}


def _as_saved(plain: dict[str, Any], legacy: LegacyKeys | None, prefix: str) -> dict[str, Any]:
    """The language model's config as config.json will hold it: with the transformers-4 keys written beside it."""
    keys = legacy.keys.get(prefix) if legacy is not None and legacy.written else None
    return {**plain, **keys} if keys else plain


def build_model_card(model, *, repo_id: str | None = None, base: BaseModel | None = None,
                     eval_reports: list[dict[str, Any]] | None = None, command: str | None = None,
                     model_name: str | None = None, trained: bool = False, extra_tags: list[str] | None = None,
                     serve_check: dict[str, Any] | None = None, adapter: bool = False,
                     transformers4: LegacyKeys | None = None):
    """The ``huggingface_hub.ModelCard`` of a patched ``model``; ``serve_check``: the report of a serve-check of the
    saved checkpoint, whose measured verdicts replace the known status of that engine in the Serving section.
    ``adapter``: the card of a LoRA adapter folder (``lora.save_lora(merged=False)``) on ``model``, its patched base:
    it loads through hf_posenc or peft on ``base/``, and its Serving section is that of the merged checkpoint
    (:func:`hf_posenc.checkpoints.loading.merge_line` writes it). ``transformers4``: the transformers-4 RoPE keys its
    config.json carries, or why none (:mod:`hf_posenc.publishing.legacy_folder`); the engines' launch settings read them
    too."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = get_config(model)
    if cfg is None:
        raise ValueError("the model is not patched by hf_posenc: patch it first (hf_posenc.patch(model, ...)); "
                         "use method 'none' to publish it unchanged.")
    block = getattr(model.config, CONFIG_KEY)
    base = base or BaseModel()
    reports = list(eval_reports or [])
    name = model_name or (repo_id.split("/")[-1] if repo_id
                          else f"{(base.repo_id or 'model').split('/')[-1]}-{cfg.method}")
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
    repo_id = repo_id or f"path/to/{name}"
    checkpoint = f"{repo_id}-merged" if adapter else repo_id  # what engines and the hf-posenc commands take
    launches = card_launches(_as_saved(lm_config.to_dict(), transformers4, prefix), block, checkpoint)
    known = known_status(block, getattr(lm_config, "dual_chunk_attention_config", None),
                         getattr(lm_config, "rope_parameters", None))
    card = ModelCard.from_template(
        data, template_path=template_path(),
        model_name=name, repo_id=repo_id, base_model=base.repo_id, adapter=adapter, checkpoint=checkpoint,
        merge_line=merge_line(repo_id, checkpoint) if adapter else None,
        method=cfg.method, method_summary=resolve_method(cfg.method).summary, factor=cfg.factor,
        asked=cfg.asked.to_text() if cfg.asked is not None else None, config_text=cfg.to_text(),
        params={k: v for k, v in cfg.params.items() if v is not None},
        original_context=original, new_context=getattr(lm_config, "max_position_embeddings", None),
        **_own_scaling(block, prefix, getattr(lm_config, "rope_parameters", None)),
        family=block.get("family"), native=bool(block.get("native")),
        layers=layers_note(*computed_layers(model)) if cfg.spec.kind == "attention" else None,
        rope_parameters=getattr(lm_config, "rope_parameters", None),
        changes_weights=holds_patch(block), trained=trained, auto_class=auto_class,
        command=recorded_command(command), environment=environment(), eval_sections=_eval_sections(reports),
        in_model_index=bool(results),
        serving=measured_rows(with_launches(known, block, launches), serve_check),
        transformers4=card_line(transformers4), launches=launches,
    )
    card.content = scrub(card.content)  # the commands it quotes (the card's own and its reports') carry no secret
    return card
