"""``hf-posenc serve-config PATH --engine E``: the launch settings under which each engine computes what hf_posenc
computes for a saved checkpoint folder or a GGUF written by ``hf-posenc patch --gguf`` -- or why it cannot.

:func:`describe` reads the checkpoint (config.json and its hf_posenc record, or the GGUF's metadata and record)
into the facts the engines' launchers (:mod:`hf_posenc.engines.launch`) work from; :func:`serve_config` asks them.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from ..adapters.layout import default_layer_types, per_layer_type, rope_geometry
from ..checkpoints.legacy_rope import stated
from ..config import PosEncConfig
from ..engines.launch import LAUNCHERS, Launch, Served
from ..engines.launch.base import CANNOT, TooLong, fence_for
from ..engines.registry import display_name
from ..methods import resolve_method
from ..methods.remapped import REMAPPED
from ..methods.rope import SCALINGS
from .checkpoint_facts import context_of, original_of, read_block
from .gguf_file import ARCHITECTURES, is_gguf, llama_cpp_metadata, method_refusal, refusal
from .support import PROPORTIONAL, scaled_proportional


def _geometry(plain: dict[str, Any], block: dict[str, Any], original: int):
    """The model's original RoPE (base, rotary dim, L), from config.json and the record's original values."""
    rp = dict((block.get("original") or {}).get("rope_parameters") or plain.get("rope_parameters") or {})
    rp.setdefault("rope_theta", plain.get("rope_theta", 10000.0))
    cfg = SimpleNamespace(**{k: plain.get(k) for k in ("head_dim", "hidden_size", "num_attention_heads",
                                                       "partial_rotary_factor")})
    return rope_geometry(cfg, original, rp)


def _unjudged(plain: dict[str, Any], arch: str) -> str | None:
    """What hf_posenc does not know to judge llama.cpp's reading of a checkpoint by (None: it knows all of it)."""
    unknown = [f"how llama.cpp's converter writes a {arch or 'model_type-less'} checkpoint (hf_posenc writes out "
               f"{', '.join(ARCHITECTURES)})" if arch not in ARCHITECTURES else "",
               "" if plain.get("hidden_size") else "its attention geometry (config.json states no hidden_size)",
               "" if plain.get("rope_parameters") else "its RoPE (config.json states no rope_parameters)"]
    return "; ".join(u for u in unknown if u) or None


def _llama_cpp(cfg: PosEncConfig, plain: dict[str, Any], block: dict[str, Any], original: int,
               arch: str) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """llama.cpp's RoPE metadata for the checkpoint, or None with why it cannot compute it -- and, where that
    depends on what hf_posenc does not know of the checkpoint (another architecture, no attention geometry), what
    it does not know: then only the engine can tell (serve-check measures it)."""
    why = method_refusal(cfg) or (_own_refusal(_served_rope(plain, block)) if cfg.method == "none" else None)
    if why:
        return None, why, None
    why = refusal(cfg, arch if arch in ARCHITECTURES else "llama")
    if why or not plain.get("hidden_size"):
        return None, why, _unjudged(plain, arch)
    return llama_cpp_metadata(cfg, _geometry(plain, block, original)), None, None


def _own_refusal(rope: dict[str, Any]) -> str | None:
    """Why no GGUF computes the checkpoint's own scaling (``rope``, left as it is) as transformers does, whatever
    the architecture; None where one may."""
    if rope.get("rope_type") != "longrope" or SCALINGS["longrope"].gguf_any_check(rope) is None:
        return None  # (one list: what a GGUF's rope_freqs hold)
    return ("the checkpoint's own longrope switches from its short to its long factors by the length of each input, "
            "and a GGUF computes one set for every input (llama.cpp's Phi-3 GGUFs hold both and pick one by the "
            "context size: the short ones only when --ctx-size is at most the original context)")


def _restored(method: str, params: dict[str, Any], original: int) -> int | None:
    """The context hf_posenc.from_pretrained restores for an attention-level method (None for the others)."""
    return REMAPPED[method].context(params, original) if method in REMAPPED and params else None


def describe(path: str) -> Served:
    """The facts of the checkpoint at ``path`` (a folder or a ``.gguf`` file) that engines are launched from."""
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path}: give the folder 'hf-posenc patch --output' wrote, or a .gguf file")
    plain, block = read_block(path, "hf-posenc serve-config")
    return served_of(plain, block, os.path.abspath(path), gguf=is_gguf(path))


def _rope_layer_types(plain: dict[str, Any]) -> tuple[str, ...] | None:
    """The layer types of a per-layer-type ``rope_parameters`` (Gemma 3), else None."""
    rp = plain.get("rope_parameters")
    return tuple(sorted(rp)) if per_layer_type(rp) else None


def _served_rope(plain: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """config.json's ``rope_parameters``; on per-layer-type RoPE those of the layer type the patch changed (its
    ``layer_types`` knob, else ``full_attention``, the one a scaling changes by default beside sliding layers)."""
    rp = dict(plain.get("rope_parameters") or {})
    types = _rope_layer_types(plain)
    if types is None:
        return rp
    chosen = (block.get("params") or {}).get("layer_types") or default_layer_types(list(types))
    return dict(rp[chosen[0]])


def served_of(plain: dict[str, Any], block: dict[str, Any], path: str, gguf: bool = False) -> Served:
    """:class:`Served` of a checkpoint whose (text) config is ``plain`` and hf_posenc record ``block`` ({} for a
    plain checkpoint), to be found at ``path`` (a folder, a GGUF, or a Hub id for a card)."""
    original = original_of(plain, block)
    method = block.get("method", "none")
    native = bool(block.get("native", True)) if block else True
    arch = str(plain.get("model_type") or plain.get("arch") or "")
    meta, why, unjudged = (plain.get("llama_cpp"), None, None) if gguf else (None, None, None)  # a GGUF holds it
    if native and not gguf:
        cfg = PosEncConfig.from_dict(block) if block else PosEncConfig("none")
        meta, why, unjudged = _llama_cpp(cfg, plain, block, original, arch)
    return Served(path=path, gguf=gguf, method=method, native=native, family=block.get("family", "rope_decoder"),
                  original=original, context=int(context_of(plain) or original), model_type=arch,
                  rope=_served_rope(plain, block), support=dict(resolve_method(method).engines),
                  llama_cpp=meta, llama_cpp_refusal=why, llama_cpp_unjudged=unjudged,
                  frozen_at=block.get("frozen_at"),
                  restored=_restored(method, block.get("params") or {}, original),
                  dual_chunk=plain.get("dual_chunk_attention_config"), legacy=None if gguf else stated(plain),
                  rope_layer_types=_rope_layer_types(plain),
                  stated=int(plain["max_position_embeddings"]) if plain.get("max_position_embeddings") else None)


def serve_config(path: str, engines: list[str] | None = None, max_length: int | None = None) -> list[Launch]:
    """The launch settings of ``path`` for each of ``engines`` (default: every engine in
    :data:`hf_posenc.engines.launch.LAUNCHERS`), for inputs up to ``max_length`` tokens (default: the context the
    checkpoint advertises)."""
    engines = list(LAUNCHERS) if engines is None else engines
    unknown = [e for e in engines if e not in LAUNCHERS]
    if unknown or not engines:
        raise ValueError(f"--engine must be among {list(LAUNCHERS)}, got {engines}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"--max-length must be a whole number of tokens >= 2, got {max_length!r}")
    served = describe(path)
    return [engine_launch(e, served, max_length) for e in engines]


def engine_launch(engine: str, served: Served, max_length: int | None) -> Launch:
    """One engine's launch; a length past what it computes is that engine's ``cannot``, the others still answer."""
    if scaled_proportional(served.rope):
        return Launch(display_name(engine), CANNOT, f"{PROPORTIONAL} (hf_posenc.from_pretrained, or plain "
                                                    "AutoModelForCausalLM.from_pretrained).")
    try:
        return LAUNCHERS[engine](served, max_length)
    except TooLong as why:
        return Launch(why.engine, "cannot", str(why))


def card_launches(plain: dict[str, Any], block: dict[str, Any], repo_id: str) -> list[dict[str, Any]]:
    """For a model card: each engine's verdict and shell lines for the checkpoint published as ``repo_id`` (a RoPE
    decoder's; [] for the other families, whose engines are not covered)."""
    if block.get("family", "rope_decoder") != "rope_decoder":
        return []
    served = served_of(plain, block, repo_id)
    return [{"engine": launch.engine, "computes": launch.computes, "reason": launch.reason,
             "shell": "\n".join(launch.shell()), "fence": fence_for(launch.shell()), "checked": launch.checked}
            for launch in (engine_launch(name, served, None) for name in LAUNCHERS)]
