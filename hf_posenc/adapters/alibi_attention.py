"""ALiBi through SDPA without materialising a ``[heads, L, L]`` bias: a Hankel view and causal query blocks.

Registered in transformers' attention and mask registries under the name ``hf_posenc_alibi`` (an
added entry; no existing function or class changes). A patched model's own (isolated) config selects
it through ``_attn_implementation``; every other model keeps its implementation.

Without a padding mask (training on packed text, perplexity, cached decoding) the ALiBi bias
``-slope_h * (p - j)`` of query position ``p`` and key ``j`` depends on ``p - j`` only. With the keys
(and values) read in reverse order, ``j' = K - 1 - j``, it depends on ``p + j'`` only, so the whole
``[heads, q, K]`` mask is an ``as_strided`` view with strides ``(n, 1, 1)`` over one line of ``n``
values per head (``bias_line``): no ``L x L`` tensor is built or read from memory, and attention is
unchanged by the order of its keys. Causal queries then run in blocks of ``block`` rows, each reading
only the keys up to its last position, so the upper triangle that RoPE's causal kernel skips is
skipped here too (within one block's diagonal square). Grouped-query heads go to SDPA as they are
(``enable_gqa``) on CPU, repeated elsewhere.

With a padding mask from the model, the additive mask -- the ALiBi bias, ``finfo.min`` where the
causal or padding mask forbids -- is built once per forward call and shared by all layers (and
reused while the mask and shapes stay the same). When ``heads x q x k`` exceeds ``full_limit``
elements (long contexts: 12k tokens would need GBs), queries run in blocks with a mask built for
each block. Positions are those of the KV cache: query ``i`` of a call is at ``past + i``, key ``j``
at ``j``, so cached decoding and left padding (masked keys) give the same scores as the full sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .attention import CacheOffset, register_attention, repeat_heads

NAME = "hf_posenc_alibi"
STATE_ATTR = "_hf_posenc_alibi"  # per attention module: the AlibiState of its model


class AlibiState(CacheOffset):
    """Slopes, and the cache offset of the current forward call."""

    sliding_ok = True  # the bias reads only i - j: a cache sliding over the model's own window keeps it exact

    def __setstate__(self, state: dict) -> None:  # unpickled in a fresh process: the attention function is registered
        self.__dict__.update(state)
        register()

    flat = False  # a layer without positions (NoPE): SDPA's own attention with the model's mask, no bias

    def __init__(self, slopes: torch.Tensor, block: int = 256, full_limit: int = 2**28, causal: bool | None = None):
        super().__init__()
        self.slopes = slopes
        self.causal = causal  # None: the attention module's own ``is_causal``
        self.block = block
        self.full_limit = full_limit
        self._mask = self._key = self._source = None
        self._line = self._line_key = None

    def line(self, k: int, n: int, dtype, device, causal: bool) -> torch.Tensor:
        """``bias_line`` for this call, shared by all layers (and calls) of the same shape."""
        key = (k, n, dtype, device, causal)
        if self._line_key != key:
            self._line, self._line_key = bias_line(self.slopes, k, n, dtype, device, causal), key
        return self._line

    def full_mask(self, attention_mask, b: int, h: int, q: int, k: int, past: int, dtype, device,
                  causal: bool = True) -> torch.Tensor:
        key = (past, q, k, b if attention_mask is not None else None, dtype, device, causal)
        if self._mask is not None and self._key == key and self._source is attention_mask:
            return self._mask
        self._mask = None  # free the old one before building
        self._mask = block_mask(self.slopes, attention_mask, 0, q, k, past, dtype, device, causal)
        self._key, self._source = key, attention_mask
        return self._mask

    def eager_layer_hook(self, module, args, kwargs):
        """For eager attention (a causal decoder layer's pre-hook): its attention mask becomes the shared
        additive ALiBi mask, which eager attention adds to the scores."""
        hidden = args[0] if args else kwargs["hidden_states"]
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() != 4:
            raise ValueError(f"ALiBi expects a 4-D attention mask from the model, got shape {tuple(mask.shape)}")
        b, q = hidden.shape[:2]
        k = mask.shape[-1] if mask is not None else self.past + q
        kwargs["attention_mask"] = self.full_mask(mask, b, len(self.slopes), q, k, self.query_start(q, k),
                                                  hidden.dtype, hidden.device, causal=True)
        return args, kwargs


def alibi_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """An attention function with transformers' signature: returns ``([batch, q, heads, dim], None)``."""
    state: AlibiState = module.__dict__[STATE_ATTR]
    if state.flat:  # exactly the model's own SDPA attention (the mask is SDPA's, registered with this function)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, q, _ = query.shape
    k_total = key.shape[2]
    past = state.query_start(q, k_total)
    device, dtype = query.device, query.dtype
    causal = state.causal if state.causal is not None else bool(getattr(module, "is_causal", True))
    if attention_mask is None:
        return _hankel_attention(state, query, key, value, past, causal, dropout, scaling), None
    key, value = repeat_heads(key, h // key.shape[1]), repeat_heads(value, h // value.shape[1])
    if h * q * k_total <= state.full_limit:
        mask = state.full_mask(attention_mask, b, h, q, k_total, past, dtype, device, causal)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    outs = []
    for s in range(0, q, state.block):
        e = min(q, s + state.block)
        k_end = min(k_total, past + e) if causal else k_total  # causal: later keys are never read
        mask = block_mask(state.slopes, attention_mask, s, e, k_end, past, dtype, device, causal)
        outs.append(F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, :k_end], value[:, :, :k_end],
                                                   attn_mask=mask, dropout_p=dropout, scale=scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _hankel_attention(state: AlibiState, query, key, value, past: int, causal: bool, dropout: float, scaling):
    """ALiBi attention with no padding mask: keys reversed, the bias a strided view of ``bias_line``."""
    h, q, k_total = query.shape[1], query.shape[2], key.shape[2]
    gqa = query.device.type == "cpu" and key.shape[1] != h
    if not gqa:
        key, value = repeat_heads(key, h // key.shape[1]), repeat_heads(value, h // value.shape[1])
    key, value = key.flip(2), value.flip(2)  # key j now at j' = k_total - 1 - j
    n = past + q + k_total - 1  # p + j' for every query position p and reversed key j'
    line = state.line(k_total, n, query.dtype, query.device, causal)
    block = state.block if causal else q
    outs = []
    for s in range(0, q, block):
        e = min(q, s + block)
        k_end = min(k_total, past + e) if causal else k_total  # causal: later keys are never read
        first = k_total - k_end  # reversed index of key k_end - 1
        mask = line.as_strided((1, h, e - s, k_end), (0, n, 1, 1), line.storage_offset() + past + s + first)
        outs.append(F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, first:], value[:, :, first:],
                                                   attn_mask=mask, dropout_p=dropout, scale=scaling,
                                                   enable_gqa=gqa))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous()


def bias_line(slopes, k: int, n: int, dtype, device, causal: bool = True) -> torch.Tensor:
    """``[heads, n]``: entry ``u`` is the ALiBi bias of query position ``p`` and key ``j = k - 1 - j'`` for
    every pair with ``p + j' = u``, i.e. ``-slope * (u - (k - 1))`` (``-slope * |u - (k - 1)|`` when not
    causal); ``finfo.min`` for ``u < k - 1`` (a key after the query) when causal."""
    rel = torch.arange(n, device=device) - (k - 1)  # = p - j
    distance = rel.float() if causal else rel.abs().float()
    bias = (slopes.to(device=device, dtype=torch.float32)[:, None] * -distance).to(dtype)
    if causal:
        bias = bias.masked_fill(rel < 0, torch.finfo(dtype).min)
    return bias.contiguous()


def block_mask(slopes, attention_mask, s: int, e: int, k_end: int, past: int, dtype, device,
               causal: bool = True) -> torch.Tensor:
    """The additive mask of queries ``s..e-1`` (at cache positions ``past + s ..``) over keys ``0..k_end-1``:
    ``[1 or batch, heads, e - s, k_end]``; bidirectional (``causal=False``: encoders) uses ``|i - j|``."""
    q_pos = torch.arange(past + s, past + e, device=device)
    k_pos = torch.arange(k_end, device=device)
    rel = q_pos[:, None] - k_pos[None, :]
    distance = rel.float() if causal else rel.abs().float()
    bias = (slopes.to(device=device, dtype=torch.float32)[:, None, None] * -distance).to(dtype)[None]
    allowed = (rel >= 0)[None, None] if causal else torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    if attention_mask is not None:
        am = attention_mask[:, :, s:e, :k_end]
        if am.dtype == torch.bool:
            allowed = allowed & am
        else:
            bias = bias + am.to(dtype)
    return torch.where(allowed, bias, torch.finfo(dtype).min)


def register() -> str:
    """``hf_posenc_alibi`` in transformers' attention and mask registries."""
    return register_attention(NAME, alibi_attention)
