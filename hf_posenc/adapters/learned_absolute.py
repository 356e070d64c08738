"""Encoders with a learned absolute position table: BERT, RoBERTa (and XLM-R), DistilBERT, ELECTRA,
and any model whose ``embeddings`` module holds a ``position_embeddings`` table sized by
``max_position_embeddings``.

A patch builds a new table (``hf_posenc.encodings.absolute``) and resizes everything sized by
``max_position_embeddings`` together: the ``nn.Embedding``, the ``position_ids`` and ``token_type_ids``
buffers, and the config. RoBERTa-style tables keep their first ``padding_idx + 1`` rows (unused
padding rows; positions start after them) and only the rows after them are resampled.

The result is a bigger learned table, so plain transformers loads a saved patched checkpoint as it
is (``native``). The original table is not in such a checkpoint: a reloaded model keeps its record of
the patch (``get_config``) but cannot be unpatched; load the base model for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import absolute as A
from .base import Adapter, PatchRecord
from .encoder_swaps import apply_bert_swap

# model types whose position ids start after the padding index (fairseq convention)
OFFSET_BY_PADDING = {"roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "roberta-prelayernorm"}


def position_table_module(model: nn.Module) -> nn.Module | None:
    """The embeddings module holding ``position_embeddings`` (an ``nn.Embedding``), if any."""
    base = getattr(model, "base_model", model)
    emb = getattr(base, "embeddings", None)
    if emb is not None and isinstance(getattr(emb, "position_embeddings", None), nn.Embedding):
        return emb
    return None


def table_positions(model: nn.Module) -> int | None:
    """Usable positions of the model's learned table (without RoBERTa's padding rows); None without one."""
    emb = position_table_module(model)
    return None if emb is None else emb.position_embeddings.num_embeddings - table_offset(model, emb)


def table_offset(model: nn.Module, emb: nn.Module) -> int:
    """Rows before position 0 in the table: ``padding_idx + 1`` for RoBERTa-style models, else 0."""
    if model.config.model_type in OFFSET_BY_PADDING and getattr(emb, "padding_idx", None) is not None:
        return int(emb.padding_idx) + 1
    return 0


def _check_hierarchical(n: int, factor: float) -> None:
    if factor > n:
        raise ValueError(f"hierarchical reaches at most n^2 = {n * n} positions (factor {n}) from a table of "
                         f"{n}; got factor={factor}.")


def _sinusoid_scale(table: torch.Tensor, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("scale") is None:  # the learned table's RMS
        params["scale"] = A.matching_scale(table)
    return params


@dataclass(frozen=True)
class TableMethod:
    """How one absolute method builds the new table: ``build(old table in fp32, rows, params)``; ``check(n,
    factor)`` refuses factors it cannot reach from ``n`` rows; ``defaults(old table, params)`` fills knobs that
    depend on the table; ``trainable``: whether the new table is a trained weight (the sinusoid is fixed)."""

    build: Callable[[torch.Tensor, int, dict[str, Any]], torch.Tensor]
    check: Callable[[int, float], None] = lambda n, factor: None
    defaults: Callable[[torch.Tensor, dict[str, Any]], dict[str, Any]] = lambda table, params: params
    trainable: bool = True


TABLES = {
    "interpolate": TableMethod(lambda t, m, p: A.interpolate_table(t, m)),
    "hierarchical": TableMethod(lambda t, m, p: A.hierarchical_table(t, m, p["alpha"]), check=_check_hierarchical),
    "sinusoidal": TableMethod(lambda t, m, p: A.sinusoid_table(m, t.shape[1], p["base"]) * p["scale"],
                              defaults=_sinusoid_scale, trainable=False),
}


class LearnedAbsoluteAdapter(Adapter):
    name = "learned_absolute"
    model_types = ("bert", "roberta", "xlm-roberta", "distilbert", "electra")
    kinds = frozenset({"absolute", "none"})
    swaps = ("alibi", "rope", "nope")  # position information moved into attention (encoder_swaps.py)
    generic_note = "or any model with embeddings.position_embeddings"

    def matches(self, model: nn.Module) -> bool:
        return position_table_module(model) is not None and hasattr(model.config, "max_position_embeddings")

    def _emb(self, model: nn.Module) -> nn.Module:
        emb = position_table_module(model)
        if emb is None:
            raise ValueError(f"{type(model).__name__} has no embeddings.position_embeddings table to patch.")
        return emb

    def resolve(self, model: nn.Module, cfg: PosEncConfig) -> PosEncConfig:
        emb = self._emb(model)
        n = table_positions(model)
        L = cfg.original_max_position_embeddings
        if cfg.method in self.swaps:  # (a reload re-applies to the saved zero table: L is the recorded original)
            return PosEncConfig(cfg.method, None, L or n, dict(cfg.params))
        if L is not None and L != n:
            raise ValueError(f"original_max_position_embeddings={L} conflicts with the model's position table, "
                             f"which has {n} positions; omit it or pass {n}.")
        params = dict(cfg.params)
        table = TABLES.get(cfg.method)
        if table is not None:
            table.check(n, cfg.factor)
            params = table.defaults(emb.position_embeddings.weight[table_offset(model, emb):], params)
        return PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None, n, params)

    def new_table(self, table: torch.Tensor, cfg: PosEncConfig) -> torch.Tensor:
        if cfg.method not in TABLES:
            raise ValueError(f"method {cfg.method!r} does not apply to a learned position table; "
                             f"those that do: {', '.join(TABLES)}.")
        return TABLES[cfg.method].build(table, A.extended_length(table.shape[0], cfg.factor), cfg.params)

    def apply(self, model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> bool:
        if cfg.spec.kind == "none":
            return True
        emb = self._emb(model)
        off = table_offset(model, emb)
        weight = emb.position_embeddings.weight.detach()
        if cfg.method in self.swaps:
            rows = cfg.params.get("max_position_embeddings") or (weight.shape[0] - off)
            table = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
            self._install(model, emb, torch.cat([weight[:off], table]), False, record)
            apply_bert_swap(model, cfg, record)
            return False  # plain transformers would rebuild the table-only model
        table = self.new_table(weight[off:].float(), cfg).to(weight.dtype)
        trainable = TABLES[cfg.method].trainable and emb.position_embeddings.weight.requires_grad
        self._install(model, emb, torch.cat([weight[:off], table.to(weight.device)]), trainable, record)
        return True

    def _install(self, model: nn.Module, emb: nn.Module, full: torch.Tensor, trainable: bool,
                 record: PatchRecord) -> None:
        """Replace the table by ``full`` and resize what is sized by it (buffers, config)."""
        old = emb.position_embeddings
        new = nn.Embedding(full.shape[0], full.shape[1], padding_idx=old.padding_idx, device=full.device,
                           dtype=full.dtype)
        with torch.no_grad():
            new.weight.copy_(full)
        new.weight.requires_grad_(trainable)
        record.set_attr(emb, "position_embeddings", new)
        total = full.shape[0]
        for name in ("position_ids", "token_type_ids"):
            buf = emb._buffers.get(name)
            if isinstance(buf, torch.Tensor):
                value = (torch.arange(total, device=buf.device, dtype=buf.dtype)[None] if name == "position_ids"
                         else torch.zeros(1, total, device=buf.device, dtype=buf.dtype))
                record.set_attr(emb, name, value)
        if total != model.config.max_position_embeddings:
            record.set_config("max_position_embeddings", total)

    def restores(self, block: dict[str, Any]) -> bool:
        return block.get("method") == "none"  # every other method saved a changed table

    def reapplies(self, block: dict[str, Any]) -> bool:
        return block.get("method") in self.swaps  # their attention hooks must be installed again

    def prepare_load_config(self, hf_config: Any, block: dict[str, Any]) -> Any:
        return hf_config  # the saved config already describes the saved table
