"""Per-token losses without materialising [length x vocab] logits, and the scoring interface the evaluations use.

The model body runs once over the sequence; the LM head then runs over chunks of the final hidden
states, so that only ``chunk_size x vocab`` logits exist at a time (in float32). :func:`as_scorer` gives the
evaluations a :class:`engines.scorer.Scorer` for what they were handed: a serving engine is one already, a
transformers model is wrapped in :class:`TransformersScorer`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engines.scorer import Scorer


def require_causal_lm(model) -> None:
    """Refuse a model whose next-token scores would not mean what perplexity and teacher forcing assume: an
    encoder-decoder (T5 reads the prompt with its encoder), or a bidirectional encoder (BERT's masked-LM head sees
    the very token it would predict). The rule is structural: a decoder-only model that can generate."""
    if served(model):  # a serving engine: what it serves was checked before it started
        return
    model = getattr(model, "model", model) if isinstance(model, TransformersScorer) else model
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
    """Where a model's inputs go: its first parameter's device, or a scorer's own (an engine takes token ids from
    the CPU)."""
    return model.input_device if isinstance(model, Scorer) else next(model.parameters()).device


def served(model) -> bool:
    """Whether ``model`` is a serving engine (a :class:`engines.scorer.Scorer` other than the transformers model
    wrapped in :class:`TransformersScorer`)."""
    return isinstance(model, Scorer) and not isinstance(model, TransformersScorer)


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
    if served(model):  # a serving engine scores it
        return model.token_nll(input_ids, start)
    model = model.model if isinstance(model, TransformersScorer) else model
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


class TransformersScorer:
    """A transformers model as a :class:`engines.scorer.Scorer`: the chunked LM head (:func:`token_nll`,
    :func:`last_logits`) and ``generate`` (``pad_token_id``: what it pads with)."""

    def __init__(self, model, pad_token_id: int | None = None):
        self.model, self.pad_token_id = model, pad_token_id
        self.config, self.generation_config = model.config, getattr(model, "generation_config", None)

    @property
    def input_device(self) -> torch.device:
        return input_device(self.model)

    def token_nll(self, input_ids: torch.Tensor, start: int = 1) -> torch.Tensor:
        return token_nll(self.model, input_ids, start=start)

    def argmax_last(self, input_ids: torch.Tensor, n: int) -> torch.Tensor:
        return last_logits(self.model, input_ids, n).argmax(-1).cpu()

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int, stop: list[int]) -> list[list[int]]:
        """``generate`` as the model's generation config says (its EOS stops it); ``stop`` is the engines' copy of
        that rule. An encoder-decoder's output is its new tokens already."""
        out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=self.pad_token_id)
        skip = 0 if getattr(self.config, "is_encoder_decoder", False) else input_ids.shape[1]
        return [row[skip:].tolist() for row in out]


def as_scorer(model, tokenizer=None) -> Scorer:
    """``model`` as a :class:`engines.scorer.Scorer`: itself when it is one (a serving engine), else the transformers
    model wrapped (``tokenizer``: its pad token, else its EOS, pads greedy generation)."""
    if isinstance(model, Scorer):
        return model
    pad = None if tokenizer is None else (tokenizer.eos_token_id if tokenizer.pad_token_id is None
                                          else tokenizer.pad_token_id)  # 0 is an id
    return TransformersScorer(model, pad)
