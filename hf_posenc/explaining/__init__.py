"""``hf-posenc explain``: pictures and a short text of what a method does to positions, computed by the code that
patches (:mod:`.arrays`), drawn by :mod:`.pictures`.

- RoPE scalings (pi, ntk, yarn, llama3, dynamic ones at the length asked, longrope, none): wavelength per rotary
  dimension before and after, each dimension classed (extrapolated / interpolated / blended), the attention
  temperature, and RoPE's long-range decay bound (Su et al. 2021) before and after;
- attention-level methods (self_extend, dca, string, rerope, leaky_rerope): the relative position each (query,
  key) sees over the target window, the last query's row against true distance, the largest position any key takes;
- T5 buckets (bucket_scale, max_distance): bucket against distance before and after;
- ALiBi: the bias against distance per head; BERT table extension (interpolate, hierarchical): the cosine
  similarity of the position table before and after (``model`` needed: the table is the model's).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from ..adapters import rope_compose as C
from ..adapters.base import text_config
from ..adapters.layout import current_context, default_layer_types, per_layer_type, rope_geometry, scaled_by
from ..adapters.remapped_layers import layers_note, probed_computed
from ..checkpoints.loading import refuse_lora_folder
from ..checkpoints.models import DEFAULT_MODEL, read_config, resolve_source
from ..config import CONFIG_KEY, PosEncConfig, as_config
from ..encodings.rope import RopeGeometry
from ..io.files import atomic_write_text
from ..io.output_folder import ReplacedOutput, check_replaced_output
from ..methods.rope import SCALINGS
from ..serving.gguf_file import trained_context
from . import arrays as A
from . import pictures as P

KINDS = ("none", "rope", "attention", "relative_bucket", "swap", "absolute")
MAX_LENGTH = 1 << 21  # 2,097,152 tokens: the decay bound of every distance stays a few hundred MB
MAX_RESOLUTION = 2048  # sampled queries and keys of the relative-position map
PICTURED_SWAPS = ("alibi",)
PICTURED_ABSOLUTE = ("interpolate", "hierarchical")


@dataclass(frozen=True)
class Geometry:
    """What the pictures need of a model: rotary head_dim (x partial rotary factor) and rope_theta, its original
    context, attention heads (ALiBi) and T5's bucket settings; ``model``: where they were read (None: given)."""

    head_dim: int
    rope_theta: float
    original: int
    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    model: str | None = None
    turning: int | None = None  # a proportional RoPE's turning pairs (RopeGeometry.turning); None: all


def geometry_of(model: str | None = None, head_dim: int | None = None, rope_theta: float | None = None,
                original: int | None = None, layer_types: list[str] | None = None) -> Geometry:
    """The geometry of ``model`` (its config alone: no weights are read; on per-layer-type RoPE, that of
    ``layer_types``, as :func:`layer_rope` picks them), each value replaced by the one given; without ``model``, the
    default model's, unless all three are given."""
    if model is None and None not in (head_dim, rope_theta, original):
        return Geometry(int(head_dim), float(rope_theta), int(original), num_heads=8)

    name = model or DEFAULT_MODEL
    src = resolve_source(name)
    refuse_lora_folder(src.path, "hf-posenc explain --model", name)
    hf_config = read_config(src)
    trained = trained_context(hf_config, src)  # (a patched GGUF's config gets its original values back first)
    lm = text_config(hf_config)[0]
    rp = layer_rope(lm, layer_types)
    own, turning = 64, None
    if getattr(lm, "num_attention_heads", None):
        rope = rope_geometry(lm, 1, {"rope_theta": 1.0, **rp}, _layer_type(lm, rp))
        own, turning = rope.dim, rope.turning
    return Geometry(int(head_dim or own), float(rope_theta or _original_theta(hf_config) or rp.get("rope_theta")
                                                or 10000.0),
                    int(original or trained or getattr(lm, "n_positions", None) or 512),
                    int(getattr(lm, "num_attention_heads", None) or getattr(lm, "num_heads", 8)),
                    int(getattr(lm, "relative_attention_num_buckets", 32)),
                    int(getattr(lm, "relative_attention_max_distance", 128)), name,
                    turning if head_dim is None else None)


def _layer_type(lm, rp: dict[str, Any]) -> str | None:
    """The layer type whose ``rope_parameters`` are ``rp`` (per-layer-type RoPE), else None."""
    layered = getattr(lm, "rope_parameters", None)
    return next((t for t, v in layered.items() if v is rp), None) if per_layer_type(layered) else None


def layer_rope(lm, layer_types: list[str] | None = None) -> dict[str, Any]:
    """The language model's ``rope_parameters`` a RoPE scaling changes: the flat ones, or on per-layer-type RoPE
    those of ``layer_types`` (default as the patch chooses: ``full_attention`` beside sliding types, else all),
    which must be alike to be drawn as one."""
    rp = getattr(lm, "rope_parameters", None) or {}
    if not per_layer_type(rp):
        return rp
    types = sorted(rp)
    chosen = layer_types or default_layer_types(types)
    unknown = sorted(set(chosen) - set(types))
    if unknown:
        raise ValueError(f"layer_types has {unknown}, which this model does not have; its RoPE layer types: {types}")
    if any(rp[t] != rp[chosen[0]] for t in chosen[1:]):
        raise ValueError(f"the layer types {chosen} have different RoPE ({', '.join(f'{t}: {rp[t]}' for t in chosen)})"
                         f": explain draws one; give layer_types with one of them")
    return rp[chosen[0]]


class OnCheckpoint(NamedTuple):
    """A RoPE scaling on a checkpoint whose RoPE is already scaled: its ``own`` RoPE (``rope_compose.OwnRope``),
    the ``context`` it advertises, and the ``composed`` configuration extending it (None: the scaling replaces it)."""

    own: Any
    context: int
    composed: PosEncConfig | None


def _checkpoint_rope(cfg: PosEncConfig, geom: Geometry) -> OnCheckpoint | None:
    """On a checkpoint whose RoPE is already scaled (read from ``geom.model``'s config; not one hf_posenc patched),
    what a RoPE scaling given no original context does there, as the patch does it (:mod:`..adapters.rope_compose`):
    (the checkpoint's own RoPE, the context it advertises, the composed configuration); else None."""
    if cfg.original_max_position_embeddings is not None:
        return None
    found = _own_rope(cfg, geom)
    if found is None:
        return None
    own, context, own_type = found
    C.check_rule(cfg, own_type, f"give --original-max-position {C.replacing_original(own)} to draw it replacing "
                 "its scaling instead")
    return OnCheckpoint(own, context, C.compose(cfg, own, context))


def _replaced_rope(cfg: PosEncConfig, geom: Geometry, original: int) -> OnCheckpoint | None:
    """On a checkpoint whose RoPE is already scaled, a RoPE scaling given its ``original`` context replaces that
    scaling, as the patch does: that context checked against the one the checkpoint's scaling is computed from
    (a ValueError naming it), and (the checkpoint's own RoPE, the context it advertises), drawn as "before"; else
    None."""
    found = _own_rope(cfg, geom)
    if found is None:
        return None
    own, context, own_type = found
    recorded = C.replacing_original(own)
    allowed = {recorded} | ({own.rope.get("original_max_position_embeddings")}
                            if SCALINGS[cfg.method].per_dimension else set())  # (factors stated: at its switch too)
    if recorded is not None and original not in allowed:
        raise ValueError(f"--original-max-position {original} conflicts with {geom.model}, whose RoPE is already "
                         f"scaled (rope_type={own_type!r}, computed from {recorded} tokens): give {recorded} to draw "
                         f"{cfg.method} replacing its scaling, or omit it to draw {cfg.method} extending it from its "
                         f"current context ({context:,}).")
    why = C.shrink_refusal(cfg.replace(original_max_position_embeddings=original), context, own_type)
    if why:  # as the patch refuses it
        raise ValueError(f"{why} to draw it replacing that scaling, or omit --original-max-position to draw it "
                         "extending from its current context.")
    return OnCheckpoint(own, context, None)


def _own_rope(cfg: PosEncConfig, geom: Geometry) -> tuple[Any, int, str] | None:
    """The scaled RoPE of ``geom.model``'s checkpoint a RoPE scaling ``cfg`` meets (its own RoPE, the context it
    advertises, its rope_type), else None (no model, not a RoPE scaling, plain RoPE, or a patched checkpoint drawn
    from its stored original geometry)."""
    if cfg.spec.kind != "rope" or geom.model is None:
        return None
    hf_config = read_config(resolve_source(geom.model))
    lm, prefix = text_config(hf_config)
    block = getattr(hf_config, CONFIG_KEY, None)
    if block and C.kept_scaling(block) is None:
        return None  # a patched checkpoint: drawn from its stored original geometry (a kept scaling: its saved one)
    rp = layer_rope(lm, cfg.params.get("layer_types"))
    own_type = scaled_by(rp)
    context = current_context(getattr(lm, "max_position_embeddings", None), rp)
    if own_type is None or not isinstance(context, int):
        return None
    layered = rp is not getattr(lm, "rope_parameters", None)
    own = C.own_rope_of_config(lm, next(t for t, v in lm.rope_parameters.items() if v is rp) if layered else None,
                               block, prefix)
    return own, context, own_type


def _original_theta(hf_config) -> float | None:
    """A patched checkpoint's original rope_theta (ntk saves a new one; a scaling the checkpoint is keeps the saved
    one: ``rope_compose.kept_scaling``)."""
    block = getattr(hf_config, CONFIG_KEY, None)
    if C.kept_scaling(block) is not None:
        return None
    original = (block or {}).get("original", {}) if isinstance(block, dict) else {}
    rp = original.get("rope_parameters") or {}
    return rp.get("rope_theta") or original.get("rope_theta")


def _target(cfg: PosEncConfig, geom: Geometry, length: int | None) -> int:
    if length is not None:
        if not isinstance(length, int) or not 2 <= length <= MAX_LENGTH:
            raise ValueError(f"--length must be a whole number of tokens from 2 to {MAX_LENGTH:,}, got {length!r}")
        return length
    factor = cfg.factor if cfg.spec.uses_factor and cfg.factor and cfg.factor > 1 else 2.0
    n = int(round(factor * geom.original))
    if n > MAX_LENGTH:
        raise ValueError(f"the target length {n:,} (factor {factor:g} x L {geom.original:,}) is past the "
                         f"{MAX_LENGTH:,} tokens explain draws: give --length")
    return n


def _rope(cfg: PosEncConfig, geom: Geometry, length: int, output: str,
          on: OnCheckpoint | None = None) -> dict[str, Any]:
    if on is None or on.composed is None:  # plain RoPE, or a scaling replacing the checkpoint's: "before" its RoPE
        w = A.rope_wavelengths(cfg, RopeGeometry(geom.rope_theta, geom.head_dim, geom.original, geom.turning),
                               length, before=on.own.inv_freq if on else None)
        lead = "" if on is None else (
            f"The checkpoint's RoPE is already scaled ({on.own.rope['rope_type']}, a context of {on.context:,}): "
            f"{cfg.to_text()} from the original context {geom.original:,} replaces that scaling, computed from the "
            f"plain frequencies; \"before\" is the checkpoint's own RoPE, attention temperature "
            f"{on.own.attention:.4f} before. ")
    else:  # composed on the checkpoint's own scaling: "before" is its own RoPE
        own, context, composed = on.own, on.context, on.composed
        rg = RopeGeometry(geom.rope_theta, geom.head_dim, composed.original_max_position_embeddings, geom.turning)
        w = A.rope_wavelengths(composed, rg, length, before=own.inv_freq, context=context, factor=cfg.factor)
        lead = (f"The checkpoint's RoPE is already scaled ({own.rope['rope_type']}, a context of {context:,}): "
                f"{cfg.to_text()} extends it from there, computed as {composed.method} (inputs up to "
                f"{composed.original_max_position_embeddings:,} keep the checkpoint's frequencies); \"before\" is "
                f"the checkpoint's own RoPE, attention temperature {own.attention:.4f} before. ")
    dense = torch.arange(length, dtype=torch.float64)  # every distance (the bound oscillates from one to the next)
    full = (A.decay_bound(2 * math.pi / w["wavelength_before"], dense),
            A.decay_bound(2 * math.pi / w["wavelength_after"], dense))
    title = f"{cfg.method} (factor {cfg.factor or 1:g}) on head_dim {geom.head_dim}, rope_theta {geom.rope_theta:g}"
    pictures = [P.wavelengths(w, title, os.path.join(output, "wavelengths.png")),
                P.decay({"before": A.binned_mean(full[0]), cfg.method: A.binned_mean(full[1])}, geom.original,
                        length, "RoPE long-range decay (Su et al. 2021), mean per log-spaced bin of distances:\n"
                        + title, os.path.join(output, "decay.png"))]
    counts = {c: w["classes"].count(c) for c in dict.fromkeys(w["classes"])}
    L = w["original"]
    near, far = slice(min(L // 2, length - 1), min(L, length)), slice(L, length)
    if geom.turning is not None:
        lead += (f"A proportional RoPE: {geom.turning} of the head's {geom.head_dim // 2} pairs turn, the others "
                 "never (frequency 0, kept so by every scaling); the turning ones are drawn. ")
    text = (lead + f"Of the {len(w['classes'])} rotary dimension pairs: "
            + ", ".join(f"{n} {c}" for c, n in counts.items())
            + f". Pairs completing a rotation within L = {L:,}: {w['rotating_before']} before, "
            f"{w['rotating_after']} after. Attention temperature: {w['attention']:.4f}. Longest wavelength: "
            f"{w['wavelength_before'][-1]:,.0f} -> {w['wavelength_after'][-1]:,.0f} tokens. Decay bound, mean over "
            f"distances L/2 .. L: {full[0][near].mean():.3f} -> {full[1][near].mean():.3f}"
            + (f"; over L .. {length:,}: {full[0][far].mean():.3f} -> {full[1][far].mean():.3f}" if length > L else "")
            + ".")
    data = {"classes": w["classes"], "wavelength_before": w["wavelength_before"].tolist(),
            "wavelength_after": w["wavelength_after"].tolist(), "attention": w["attention"],
            "rotating_before": w["rotating_before"], "rotating_after": w["rotating_after"],
            "decay_binned": {k: [v.tolist() for v in A.binned_mean(b)] for k, b in zip(("before", "after"), full)},
            **({"own_rope": on.own.rope, "context": on.context} if on else {}),
            **({"composed": on.composed.to_dict()} if on and on.composed else {}),
            **({"replaced": True} if on and on.composed is None else {})}
    return {"pictures": pictures, "text": text, "data": data}


def _attention(cfg: PosEncConfig, geom: Geometry, length: int, output: str, resolution: int) -> dict[str, Any]:
    m = A.remapped_map(cfg, geom.original, length, resolution)
    knobs = ", ".join(f"{k}={v}" for k, v in m["params"].items() if v is not None)
    title = f"{cfg.method} ({knobs}) over {length:,} tokens, L = {geom.original:,}"
    pictures = [P.remapped(m, title, os.path.join(output, "positions.png"))]
    inside = "within" if m["largest"] < geom.original else "past"
    layers = _layers_note(geom.model)
    text = ((f"On {geom.model}, {layers}. " if layers else "")
            + f"Over {length:,} tokens the largest relative position any key takes is {m['largest']:,.0f}: {inside} "
            f"the trained range (L = {geom.original:,}). The method advertises {m['advertised']:,} tokens"
            + (f"; every score scaled by {m['score_scale']:.4f}" if m["score_scale"] != 1.0 else "")
            + ("; queries scaled by up to " + f"{float(m['query_scale'].max()):.4f} (log-n)"
               if m["query_scale"] is not None else "") + ".")
    data = {"positions": m["positions"].tolist(), "largest": m["largest"], "advertised": m["advertised"],
            "params": m["params"], "last_row_every_64": m["last_row"][::64].tolist(), "layers": layers}
    return {"pictures": pictures, "text": text, "data": data}


def _layers_note(model: str | None) -> str | None:
    """Which layers an attention-level method computes on ``model``, where it leaves some: from its config (sliding
    layers, declared NoPE ones) and a narrow twin built from it (global NoPE layers, found by running them); on a
    multimodal model (a sub-config beside its language model's), that it runs on text inputs."""
    if model is None:
        return None
    config = read_config(resolve_source(model))
    lm, prefix = text_config(config)
    note = layers_note(*probed_computed(lm))
    if prefix and set(getattr(config, "sub_configs", None) or {}) - {prefix[:-1]}:  # images, videos or audio beside
        media = "on text inputs: a call with images, videos or audio is refused before its language model runs"
        note = f"{note}; {media}" if note else media
    return note


def _buckets(cfg: PosEncConfig, geom: Geometry, length: int, output: str) -> dict[str, Any]:
    b = A.t5_buckets(cfg, length, geom.num_buckets, geom.max_distance)
    title = f"{cfg.method} (factor {cfg.factor or 1:g}): T5 buckets, {geom.num_buckets} of them"
    pictures = [P.buckets(b, title, os.path.join(output, "buckets.png"))]
    def shared(n: int | None) -> str:
        return f"from {n:,} tokens" if n is not None else f"not within {length:,} tokens"

    text = (f"Distances share T5's last bucket {shared(b['last_shared_before'])} before, "
            f"{shared(b['last_shared_after'])} after (max_distance {b['max_distance_before']} -> "
            f"{b['max_distance_after']}).")
    return {"pictures": pictures, "text": text,
            "data": {"before": b["before"].tolist(), "after": b["after"].tolist(),
                     "last_shared_before": b["last_shared_before"], "last_shared_after": b["last_shared_after"]}}


def _alibi(cfg: PosEncConfig, geom: Geometry, length: int, output: str) -> dict[str, Any]:
    a = A.alibi(geom.num_heads, length)
    pictures = [P.alibi(a, geom.original, f"ALiBi on {geom.num_heads} heads (Press et al. 2022)",
                        os.path.join(output, "alibi.png"))]
    text = (f"ALiBi replaces the positional encoding by a bias -slope x distance per head; slopes "
            f"{float(a['slopes'].min()):.3g} .. {float(a['slopes'].max()):.3g}. No position is out of range: the bias "
            "grows with distance, so far keys fade at every length.")
    return {"pictures": pictures, "text": text, "data": {"slopes": a["slopes"].tolist()}}


def _absolute(cfg: PosEncConfig, geom: Geometry, output: str) -> dict[str, Any]:
    from transformers import AutoModel

    if geom.model is None:
        raise ValueError(f"{cfg.method} extends a model's learned position table: give --model (a BERT-family model)")
    src = resolve_source(geom.model)
    t = A.absolute_tables(AutoModel.from_pretrained(src.path, **src.kwargs).eval(), cfg)
    pictures = [P.similarity(t, f"{cfg.method} (factor {cfg.factor or 1:g}) on {geom.model}",
                             os.path.join(output, "similarity.png"))]
    text = (f"The position table grows from {t['before'].shape[0]:,} to {t['after'].shape[0]:,} positions; the "
            "pictures show how alike the vectors of any two positions are, before and after.")
    return {"pictures": pictures, "text": text, "data": {"positions_before": t["before"].shape[0],
                                                          "positions_after": t["after"].shape[0]}}


def _check(cfg: PosEncConfig) -> str:
    kind = cfg.spec.kind
    if kind == "swap" and cfg.method not in PICTURED_SWAPS \
            or kind == "absolute" and cfg.method not in PICTURED_ABSOLUTE:
        raise ValueError(f"explain draws no picture of {cfg.method!r} yet; it draws the RoPE scalings, the "
                         f"attention-level methods, T5 buckets, {', '.join(PICTURED_SWAPS)} and "
                         f"{', '.join(PICTURED_ABSOLUTE)} (see 'hf-posenc methods')")
    return kind


def explain(config: Any, output: str, *, model: str | None = None, head_dim: int | None = None,
            rope_theta: float | None = None, original: int | None = None, length: int | None = None,
            resolution: int = 256) -> dict[str, Any]:
    """Pictures and a text of what a method does to positions (see the module docstring).

    Args:
        config: a method name, its text form (``"yarn:factor=4"``), a dict or a :class:`PosEncConfig`.
        output: the folder the PNGs, ``explain.md`` and ``explain.json`` are written into.
        model: a model name whose config gives the geometry (head dim, rope_theta, original context).
        head_dim: the head dimension, when no model is given.
        rope_theta: the RoPE base, when no model is given.
        original: the original context L, when no model is given.
        length: the longest position drawn (default: the method's context).
        resolution: points per curve.

    Returns:
        ``{method, kind, length, pictures, text, data}``.
    """
    cfg = PosEncConfig.parse(config) if isinstance(config, str) and ":" in config else as_config(config)
    kind = _check(cfg)
    if not isinstance(resolution, int) or not 8 <= resolution <= MAX_RESOLUTION:
        raise ValueError(f"--resolution must be a whole number from 8 to {MAX_RESOLUTION}, got {resolution!r}")
    for name, value in (("--head-dim", head_dim), ("--original-max-position", original)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if rope_theta is not None and not rope_theta > 1:
        raise ValueError(f"--rope-theta must be > 1 (RoPE's base), got {rope_theta!r}")
    if kind == "absolute" and model is None:
        raise ValueError(f"{cfg.method} extends a model's learned position table: give --model (a BERT-family model)")
    if head_dim is not None and head_dim % 2:
        raise ValueError(f"--head-dim must be even (RoPE rotates pairs of dimensions), got {head_dim}")
    check_replaced_output(output, "explain")  # new, empty, or an earlier explain's output unchanged
    geom = geometry_of(model, head_dim, rope_theta, original, cfg.params.get("layer_types"))
    on = _checkpoint_rope(cfg, geom) if original is None else None
    if on is not None:
        geom = replace(geom, original=on.context)
    replaced = _replaced_rope(cfg, geom, original) if original is not None else None
    n = _target(cfg, geom, length)
    with ReplacedOutput(output, "explain") as folder, folder.staged() as tmp:  # in place when complete
        done = _draw(cfg, kind, geom, n, tmp, on or replaced, resolution)
        done["pictures"] = [os.path.join(output, os.path.basename(p)) for p in done["pictures"]]
        out = {"method": cfg.method, "kind": kind, "config": cfg.to_dict(), "length": n,
               "geometry": geom.__dict__, **done}
        atomic_write_text(os.path.join(tmp, "explain.json"), json.dumps(out, indent=1, default=float) + "\n")
        atomic_write_text(os.path.join(tmp, "explain.md"), _markdown(out))
    return out


def _draw(cfg: PosEncConfig, kind: str, geom, n: int, folder: str, on, resolution: int) -> dict[str, Any]:
    """The pictures of ``cfg`` drawn into ``folder``, with their text and data."""
    if kind in ("rope", "none"):
        return _rope(cfg, geom, n, folder, on)
    if kind == "attention":
        return _attention(cfg, geom, n, folder, resolution)
    if kind == "relative_bucket":
        return _buckets(cfg, geom, n, folder)
    if kind == "swap":
        return _alibi(cfg, geom, n, folder)
    return _absolute(cfg, geom, folder)


def _markdown(out: dict[str, Any]) -> str:
    g = out["geometry"]
    lines = [f"# {out['method']}: what it does to positions", "",
             f"{out['text']}", "",
             f"Geometry: head_dim {g['head_dim']}, rope_theta {g['rope_theta']:g}, original context "
             f"{g['original']:,}" + (f" (from {g['model']})" if g["model"] else "") + f"; target length "
             f"{out['length']:,}.", ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in out["pictures"]]
    return "\n".join(lines) + "\n"
