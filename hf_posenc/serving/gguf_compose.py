"""A RoPE scaling on top of the scaling a GGUF already states, as :mod:`hf_posenc.adapters.rope_compose` does for a
checkpoint folder: the new method works on the frequencies llama.cpp computes from the source's metadata (a
``rope_freqs`` tensor such as Llama 3.1's, a linear or a YaRN scaling) with L = the source's current context, so
``yarn`` x2 on a 128k GGUF gives 256k. A GGUF holds one set of frequencies, so the result is written as a longrope
with one list (frozen): every input, shorter ones included, gets the composed frequencies, as with any static scaling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..config import PosEncConfig
from ..encodings import rope as R
from ..methods.rope import LLAMA_CPP_YARN_BETAS, SCALINGS


@dataclass(frozen=True)
class StatedScaling:
    """What a GGUF's metadata states of its RoPE beyond the base: ``kind`` (none, linear, yarn), ``factor``, the
    ``original`` context of YaRN's ramp, ``attn_factor``, the ``rope_freqs`` divisors (or empty) and the ``context``
    it advertises."""

    kind: str
    factor: float
    original: int
    attn_factor: float
    context: int
    freqs: list[float] = field(default_factory=list)

    @property
    def scaled(self) -> bool:
        return bool(self.freqs) or (self.kind not in ("", "none") and self.factor not in (0.0, 1.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def own_frequencies(base: float, dim: int, stated: StatedScaling) -> tuple[torch.Tensor, float]:
    """The frequencies (float64) and temperature llama.cpp computes from ``stated`` on plain RoPE of ``base``."""
    inv = R.default_inv_freq(base, dim).double()
    if stated.freqs:
        if stated.kind not in ("", "none"):
            raise ValueError(f"the source states both a rope_freqs tensor and a {stated.kind} scaling; hf_posenc "
                             "composes on one of them: give --original-max-position-embeddings to replace them")
        return inv / torch.tensor(stated.freqs, dtype=torch.float64), stated.attn_factor
    if stated.kind == "linear":
        return inv / stated.factor, stated.attn_factor
    if stated.kind == "yarn":
        geom = R.RopeGeometry(base, dim, stated.original)
        beta_fast, beta_slow = LLAMA_CPP_YARN_BETAS
        yarn, temperature = R.rope_yarn(geom, stated.factor, {"beta_fast": beta_fast, "beta_slow": beta_slow,
                                                             "truncate": True})
        return yarn.double(), float(temperature) * stated.attn_factor
    raise ValueError(f"the source's RoPE scaling type {stated.kind!r} is not one hf_posenc composes on (linear, "
                     "yarn, a rope_freqs tensor): give --original-max-position-embeddings to replace it")


def composed(cfg: PosEncConfig, base: float, dim: int, stated: StatedScaling) -> PosEncConfig:
    """``cfg`` on top of ``stated``: a longrope over the source's context whose one list (short = long) holds the
    composed frequencies' factors of the base ones, and whose temperature is the source's times the method's."""
    scaling = SCALINGS.get(cfg.method)
    if scaling is None or scaling.compose is None:
        raise ValueError(f"{cfg.method!r} is not put on top of a scaling the GGUF already has (the static RoPE "
                         "scalings are: pi, ntk, yarn, llama3, longrope); give --original-max-position-embeddings to "
                         "replace the source's scaling instead")
    own, own_attention = own_frequencies(base, dim, stated)
    params = scaling.defaults(dict(cfg.params), dim // 2, cfg.factor) if scaling.defaults else dict(cfg.params)
    new, added = scaling.compose(own.float(), stated.context, cfg.factor, params)
    factors = (R.default_inv_freq(base, dim).double() / new.double()).tolist()
    return PosEncConfig("longrope", cfg.factor, stated.context, {
        "short_factor": factors, "long_factor": factors, "attention_factor": own_attention * float(added)})
