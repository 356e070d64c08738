"""The long-context evaluation of ``hf-posenc finetune``: before and after training, on the
held-out documents, at a length N past the model's original context L.

- Perplexity: the first window of N tokens of each held-out document long enough, the perplexity of its tokens past
  L (every token from position L on), the truncated baseline (the same weights
  unpatched, each token given at most L tokens before it, forwards of L tokens moved by L / 4) and the context gain
  (baseline over method). The numbers of ``hf-posenc eval ppl --lengths N --max-windows 1`` on that model.
- Needles in prose: RULER's needle at each depth in the held-out documents' text, ``trials`` keys per depth
  (teacher-forced, 5 digits, keys from the run's seed), and the needles lying wholly before the last L tokens
  (beyond the truncated model's reach). The numbers of ``hf-posenc eval passkey --haystack text --lengths N`` with
  the held-out files as its ``--text-file``.

The cells are those of the eval runners (:func:`eval.perplexity.window_cell`, :func:`truncated_window_cell`,
:func:`eval.passkey.passkey_cell`), computed on the model in memory as it will be saved: the base model under a
LoRA wrapper (its adapters in place), full attention (S²-Attn is training-time only), eval mode, no gradients; the
training mode is restored after. The truncated baseline patches the model with ``none`` for its cells; the model's
own patch is then applied again and every weight that re-applying it re-created (a learned position table) gets the
trained values back, so the evaluation leaves the patch, the weights and their ``requires_grad`` as they were.

Several processes (torchrun / accelerate launch): every process computes the same numbers, the same forwards in
the same order (under DDP each on its own copy of the model, with no collective call; under DeepSpeed ZeRO-3 each
forward gathers the partitioned weights from every process, which the identical order keeps in step; tested for DDP
only); only the main process saves the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoints.runtime import load_tokenizer
from ..config import PosEncConfig
from ..eval.haystack import TextHaystack
from ..eval.passkey import aggregate_passkey, grid, passkey_cell
from ..eval.perplexity import aggregate_length, plan_lengths, truncated_window_cell, window_cell
from ..eval.scoring import require_causal_lm
from ..io.documents import corpus_stream, tokenize_documents
from ..io.reports import markdown_table
from ..methods.rope import DYNAMIC
from ..patching import get_config, trying

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
BUCKETS = 32  # eval ppl's default --buckets: the loss curve's position buckets (past L is counted exactly)
CHUNK = 1024  # eval ppl's default --chunk-size (the LM head over chunks; the numbers do not depend on it)
DIGITS = 5  # eval passkey's default --digits


@dataclass(frozen=True)
class LongEvalSettings:
    """``length``: the evaluated length N (None: PoSE's target length when PoSE trains, else no long-context
    evaluation); ``needle_depths``: where the needle goes, fractions of the haystack in [0, 1];
    ``needle_trials``: keys per depth (0: no needles, perplexity only)."""

    length: int | None = None
    needle_depths: tuple[float, ...] = DEPTHS
    needle_trials: int = 5

    def __post_init__(self) -> None:
        n = self.length
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ValueError(f"--eval-length must be a token count past the model's original context, got {n!r}")
        try:
            depths = tuple(float(d) for d in self.needle_depths)
        except (TypeError, ValueError):
            raise ValueError(f"--eval-needle-depths must be numbers in [0, 1], got {self.needle_depths!r}") from None
        if not depths or not all(0.0 <= d <= 1.0 for d in depths):
            raise ValueError(f"--eval-needle-depths must be one or more fractions in [0, 1] (0: the haystack's start, "
                             f"1: its end), got {list(self.needle_depths)}")
        if len(set(depths)) != len(depths):
            raise ValueError(f"--eval-needle-depths lists a depth more than once: {list(self.needle_depths)}")
        object.__setattr__(self, "needle_depths", depths)
        t = self.needle_trials
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"--eval-needle-trials must be an integer >= 0 (0: no needles), got {t!r}")

    def length_for(self, pose_target: int | None) -> int | None:
        """The evaluated length: ``length``, else PoSE's target (None: no long-context evaluation)."""
        return self.length if self.length is not None else pose_target


def check_length(length: int, original: int | None, model) -> None:
    """The evaluated length must exceed the model's original context L (checked once the model is loaded)."""
    require_causal_lm(model)
    if original is None:
        raise ValueError(f"{type(model).__name__} has no fixed original context, so nothing lies past it: the "
                         "long-context evaluation does not apply (--no-long-eval)")
    _check_past(length, original)


def _check_past(length: int, original: int | None) -> None:
    if original is not None and length <= original:
        raise ValueError(f"--eval-length {length} is within the model's original context ({original}): the "
                         f"long-context evaluation measures past it; give a length above {original}, or --no-long-eval")


def prepared_long_eval(model: str, original: int | None, docs: list, settings: LongEvalSettings, length: int,
                       seed: int, progress: bool = True) -> LongEval:
    """The :class:`LongEval` of a fine-tune of ``model``, checked before the model loads: ``length`` past the
    ``original`` context read from the model's config (None when it cannot be read there: checked after the load),
    the held-out text long enough for the window and the needles' haystack (from the tokenizer alone)."""
    _check_past(length, original)
    return LongEval(load_tokenizer(model), docs, settings, length, original, seed, progress)


def unwrapped(model):
    """The model whose patch and weights are evaluated: peft's base model (its adapters in place), else ``model``."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


class LongEval:
    """The held-out windows and haystack, prepared (and checked) before training; :meth:`measure` runs the cells on
    the model as it is. ``original``: the model's original context L."""

    def __init__(self, tok, docs: list, settings: LongEvalSettings, length: int, original: int | None, seed: int,
                 progress: bool = True):
        self.tok, self.settings, self.length, self.seed = tok, settings, length, seed
        self.progress = progress
        self.bind(original)
        self.names = [d.name for d in docs]
        self.tokens = tokenize_documents(tok, docs, length)  # eval ppl --max-windows 1 reads as many
        longest = max((len(t) for t in self.tokens), default=0)
        if longest < length:
            raise ValueError(f"too little held-out text for --eval-length {length}: the longest held-out document has "
                             f"{longest} tokens; pass longer --eval-text-file documents or a smaller --eval-length")
        self.windows = plan_lengths(self.tokens, [length], "windows", None, 1)[length]
        self.haystack = None
        if settings.needle_trials:
            self.haystack = TextHaystack(tok, corpus_stream(tok, docs), 1)
            self.haystack.build(length, settings.needle_depths[0], "1" * DIGITS)  # too little text: said now

    def bind(self, original: int | None) -> None:
        """Set the model's original context L (known before the load when its config says it; else once loaded)."""
        self.original = original
        self.stride = max(1, original // 4) if original else None  # eval ppl's default --truncated-stride

    def counted_exactly(self, section: dict[str, Any] | None) -> bool:
        """Whether a stored measurement (a resumed run's, before training) counted the tokens past L from L exactly,
        as :meth:`measure` does: one an older release wrote counted them from a position bucket's edge, and is
        measured again so that before and after compare the same tokens."""
        pasts = [(section or {}).get("past_original"), ((section or {}).get("truncated") or {}).get("past_original")]
        return all(p is not None and p.get("from") == self.original for p in pasts)

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {"length": self.length, "original_context": self.original, "truncated_stride": self.stride,
                "buckets": BUCKETS, "documents": self.names,
                "windows": [self.names[w.doc] for w in self.windows],
                "needle_depths": list(s.needle_depths), "needle_trials": s.needle_trials,
                "same_as": (f"hf-posenc eval ppl --lengths {self.length} --max-windows 1"
                            + (f"; hf-posenc eval passkey --haystack text --lengths {self.length} --depths "
                               f"{','.join(f'{d:g}' for d in s.needle_depths)} --trials {s.needle_trials} --seed "
                               f"{self.seed}" if s.needle_trials else "")
                            + " (the held-out files as --text-file)")}

    def measure(self, model, desc: str) -> dict[str, Any]:
        """Perplexity past L with its truncated baseline and context gain, and the needles, of ``model`` now."""
        from tqdm.auto import tqdm

        base = unwrapped(model)
        own = get_config(base)
        kept = _Weights(base)
        s, n = self.settings, self.length
        needles = grid([n], list(s.needle_depths), self.seed) if self.haystack is not None else []
        bar = tqdm(total=2 * len(self.windows) + len(needles), desc=f"long-context eval {desc}",
                   disable=not self.progress, leave=False)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), trying(base, []) as apply:  # (left as it was: a saved scaling under a patch too)
                def fresh():  # as eval's run_cells: a dynamic method's state starts afresh before each cell
                    if own is not None and own.method in DYNAMIC:
                        kept.repatch(apply, own)

                cells = []
                for w in self.windows:
                    fresh()
                    cells.append(window_cell(base, self.tokens[w.doc], w, BUCKETS, CHUNK, self.original))
                    bar.update(1)
                found = []
                for length, depth, key_seed in needles:
                    fresh()
                    found.append((length, depth, passkey_cell(base, self.tok, self.haystack, length, depth, key_seed,
                                                              s.needle_trials, DIGITS)))
                    bar.update(1)
                kept.repatch(apply, PosEncConfig("none"))
                truncated = []
                for w in self.windows:
                    truncated.append(truncated_window_cell(base, self.tokens[w.doc], w, BUCKETS, self.original,
                                                           self.stride, CHUNK))
                    bar.update(1)
        finally:
            bar.close()
            kept.restore()
            model.train(was_training)
        mine = aggregate_length(n, self.windows, cells, self.names, BUCKETS, self.original)
        base_ppl = aggregate_length(n, self.windows, truncated, self.names, BUCKETS, self.original)
        out = {"ppl": mine["ppl"], "tokens": mine["tokens"], "windows": mine["windows"],
               "past_original": mine["past_original"],
               "truncated": {"ppl": base_ppl["ppl"], "past_original": base_ppl["past_original"]},
               "context_gain": _gain(base_ppl["past_original"], mine["past_original"])}
        if needles:
            got = aggregate_passkey([n], found, self.original)
            out["needles"] = {
                "accuracy": got["accuracy"],
                "by_depth": {f"{d:g}": {"hits": c["hits"], "trials": c["trials"], "accuracy": c["hits"] / c["trials"]}
                             for _, d, c in found},
                "beyond_reach": got["beyond_reach"][str(n)],
            }
        return out


def _gain(baseline: dict | None, method: dict | None) -> float | None:
    return baseline["ppl"] / method["ppl"] if baseline and method else None


class _Weights:
    """The model's weights and buffers as they are now (references, no copy), put back after a re-patch."""

    def __init__(self, model):
        self.model = model
        self.tensors = dict(model.state_dict(keep_vars=True))
        self.grad = {name: p.requires_grad for name, p in model.named_parameters()}

    def repatch(self, apply, config) -> None:
        """``model`` patched with ``config`` by ``apply`` (``patching.trying``'s: from the state on entry), then
        :meth:`restore`."""
        apply(config)
        self.restore()

    def restore(self) -> None:
        """A weight a patch re-created gets its kept values and ``requires_grad`` (a tensor the patch left in place is
        the kept one itself)."""
        now = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, kept in self.tensors.items():
                current = now.get(name)
                if current is not None and current is not kept and current.shape == kept.shape:
                    current.copy_(kept)
        for name, p in self.model.named_parameters():
            if name in self.grad:
                p.requires_grad_(self.grad[name])


ROWS = (("before", "before training", False), ("before", "truncated to L, before training", True),
        ("after", "after training", False), ("after", "truncated to L, after training", True))


def long_context_table(section: dict[str, Any], method: str) -> str:
    """The Markdown table of ``report["long_context"]``: the method before and after training, and the truncated
    baselines (the same weights, unpatched, at most L tokens of context)."""
    n, L, depths = section["length"], section["original_context"], section["needle_depths"]
    untrained = (section["before"]["truncated"] or {}).get("past_original")
    rows = []
    for phase, label, truncated in ROWS:
        r = section[phase]
        past = (r["truncated"] if truncated else r)["past_original"]
        row = [label if truncated else f"{label} ({method})", _num(past and past["ppl"], 2),
               "–" if truncated else _times(r["context_gain"]), _times(_gain(untrained, past))]
        needles = r.get("needles")
        if needles is not None:
            row += ["–" if truncated else _hits(needles["by_depth"][f"{d:g}"]) for d in depths]
            beyond = needles["beyond_reach"]
            row.append("–" if truncated or not beyond else _hits(beyond))
        rows.append(row)
    first = (section["before"]["past_original"] or {}).get("from")
    note = (f"Long context, held-out text at {n} tokens (original context L = {L}; the first {n}-token window of each "
            f"held-out document long enough: {', '.join(section['windows'])}). 'ppl past L': perplexity of the tokens "
            f"from position {first} on. Context gain: the truncated baseline's perplexity of the same tokens over the "
            "method's (> 1: the context past L helped). Truncated to L: the same weights, unpatched, each token given "
            f"at most {L} tokens before it (forwards of {L} moved by {section['truncated_stride']}). 'vs untrained "
            "truncated': the untrained model truncated to L over the row (what training gained over simply "
            "truncating the original model).")
    header = ["model", "ppl past L", "context gain vs truncated", "vs untrained truncated"]
    if section["needle_trials"]:
        note += (f" Needles in the held-out prose (RULER's wording, {section['needle_trials']} keys per depth, "
                 f"hits/trials per depth; beyond L: the needles lying wholly before the last {L} tokens, out of the "
                 "truncated model's reach).")
        header += [f"needles @{d:g}" for d in depths] + ["needles beyond L"]
    return note + "\n\n" + markdown_table(header, rows)


def _hits(cell: dict[str, Any]) -> str:
    return f"{cell['hits']}/{cell['trials']}"


def _num(value: float | None, digits: int) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"x{value:.3f}"
