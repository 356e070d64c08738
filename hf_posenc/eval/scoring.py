"""Per-token losses without materialising [length x vocab] logits.

The model body runs once over the sequence; the LM head then runs over chunks of the final hidden
states, so that only ``chunk_size x vocab`` logits exist at a time (in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engines.vllm_engine import EngineLM


def require_causal_lm(model) -> None:
    """Refuse a model whose next-token scores would not mean what perplexity and teacher forcing assume: an
    encoder-decoder (T5 reads the prompt with its encoder), or a bidirectional encoder (BERT's masked-LM head sees
    the very token it would predict). The rule is structural: a decoder-only model that can generate."""
    if isinstance(model, EngineLM):
        return
    cfg, name = model.config, type(model).__name__
    kind = None
    if getattr(cfg, "is_encoder_decoder", False):
        kind = "an encoder-decoder"
    elif model.get_output_embeddings() is None:
        kind = "a model without an LM head (get_output_embeddings() is None)"
    elif not model.can_generate():
        kind = "not a causal language model (it cannot generate: a bidirectional encoder's head)"
    if kind:
        raise ValueError(f"{name} (model_type {getattr(cfg, 'model_type', None)!r}) is {kind}; next-token scoring "
                         "(eval ppl, key tokens, tune's objective, the teacher-forced passkey) needs a decoder-only "
                         "causal LM. For an encoder use `eval retrieval`; for an encoder-decoder (T5) `eval passkey`.")


def require_answering_lm(model) -> None:
    """The passkey's rule: an encoder-decoder reads the prompt with its encoder and answers from its decoder; any
    other model must be a causal LM (:func:`require_causal_lm`)."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        require_causal_lm(model)


def _head(model):
    require_causal_lm(model)
    return model.get_output_embeddings()


def _finish_logits(model, logits: torch.Tensor) -> torch.Tensor:
    """Apply the output transforms some families put after the head (Granite's scaling, Gemma's softcap)."""
    cfg = model.config
    scale = getattr(cfg, "logits_scaling", None)
    if scale:
        logits = logits / scale
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def input_device(model) -> torch.device:
    """Where a model's inputs go: its first parameter's device, or a serving engine's own
    (:class:`engines.vllm_engine.EngineLM`, which takes token ids from the CPU)."""
    return model.input_device if isinstance(model, EngineLM) else next(model.parameters()).device


def _body(model):
    """The model body (before the LM head); of a peft model, the body of the model it adapts (its adapted layers
    sit inside, in place)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.base_model


@torch.no_grad()
def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [batch, T, hidden] of the model body (after its last norm)."""
    return _body(model)(input_ids=input_ids, use_cache=False).last_hidden_state


def chunked_lm_loss(model, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                    chunk_size: int = 1024) -> tuple[torch.Tensor, int]:
    """The summed next-token cross-entropy of ``input_ids`` and the number of predicted tokens (their quotient is
    ``model(input_ids, labels=input_ids).loss``), for training, without ever holding ``[tokens, vocab]`` logits:
    the head and the loss run over chunks of ``chunk_size`` positions under activation checkpointing, so each
    chunk's logits are recomputed in the backward pass instead of kept."""
    from torch.utils.checkpoint import checkpoint

    inner = getattr(model, "module", model)  # under DistributedDataParallel: the model it wraps
    head = _head(inner)
    # through the (wrapped) model's own forward, so that data parallelism sees the call; one logit row only
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=False, output_hidden_states=True,
                logits_to_keep=1)
    hidden = out.hidden_states[-1]  # the body's output, after its last norm
    preds, labels = hidden[:, :-1], input_ids[:, 1:].to(hidden.device)

    def chunk_loss(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = _finish_logits(inner, head(h).float())
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")

    total = sum(checkpoint(chunk_loss, preds[:, s : s + chunk_size], labels[:, s : s + chunk_size], use_reentrant=False)
                for s in range(0, labels.shape[1], chunk_size))
    return total, labels.numel()


@torch.no_grad()
def token_nll(model, input_ids: torch.Tensor, chunk_size: int = 1024, start: int = 1) -> torch.Tensor:
    """Negative log-likelihood (float32, nats) of tokens ``start .. T-1`` of each row of ``input_ids``
    given the tokens before them; shape [batch, T - start]."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if not 1 <= start < input_ids.shape[1]:
        raise ValueError(f"start must be in [1, {input_ids.shape[1] - 1}], got {start}")
    if isinstance(model, EngineLM):  # a serving engine scores it
        return model.token_nll(input_ids, start)
    head = _head(model)
    hidden = final_hidden(model, input_ids)
    labels = input_ids[:, start:].to(hidden.device)
    preds = hidden[:, start - 1 : -1]
    out = torch.empty(labels.shape, dtype=torch.float32)
    for s in range(0, labels.shape[1], chunk_size):
        logits = _finish_logits(model, head(preds[:, s : s + chunk_size]).float())
        nll = F.cross_entropy(logits.transpose(1, 2), labels[:, s : s + chunk_size], reduction="none")
        out[:, s : s + chunk_size] = nll.cpu()
    return out


@torch.no_grad()
def last_logits(model, input_ids: torch.Tensor, n: int) -> torch.Tensor:
    """float32 logits predicting the tokens after each of the last ``n`` positions: [batch, n, vocab]."""
    head = _head(model)
    hidden = final_hidden(model, input_ids)
    return _finish_logits(model, head(hidden[:, -n:]).float())
