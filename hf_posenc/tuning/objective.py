"""What ``hf-posenc tune`` measures of a candidate, as evaluation cells, on data kept in two parts.

With L the original context and T the target length, three kinds of cells (each resumable, each computed
once per candidate):
- ``long``: one window of T tokens; the NLL of the positions at or beyond L (what extension is for), of the
  positions before L, and per position bucket (the loss-by-position plot);
- ``short``: one window of L tokens: perplexity on inputs the model already handled, compared with the
  unpatched model's on the same windows (the cost of the patch to short inputs);
- ``passkey``: one key hidden at a depth of a T-token prompt, teacher-forced (every key token the argmax);
- ``needles`` (when ranking by ``needle_ppl``): one window of T tokens of prose with a needle per depth and their
  questions and answers at its end, the loss of the answer tokens (:mod:`.needles`).

Calibration and confirmation never share data: the windows of each length alternate between the two parts
(even-numbered windows rank, odd-numbered ones confirm), and the passkey keys of the two parts come from
disjoint seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..eval.cells import NUMBER
from ..eval.passkey import PasskeyBuilder, passkey_cell
from ..eval.perplexity import Window, bucket_edges, plan_windows
from ..eval.scoring import token_nll
from ..eval.tasks import Objective, registered
from .needles import needle_cell

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
BUCKETS = 32
_PARTS = {"calibration": 0, "confirmation": 1}


@dataclass
class TuneData:
    """The tokenized documents and their windows of T and of L tokens, each split into the two parts."""

    docs: list[torch.Tensor]
    names: list[str]
    digests: list[str]
    long: dict[str, list[Window]]
    short: dict[str, list[Window]]


def _split(windows: list[Window]) -> dict[str, list[Window]]:
    return {part: windows[i::2] for part, i in _PARTS.items()}


def plan_data(docs: list[torch.Tensor], names: list[str], digests: list[str], original: int,
              target: int) -> TuneData:
    """Windows of ``target`` and of ``original`` tokens over ``docs``, alternating between the two parts; an
    error when the text does not give each part at least one window of ``target`` tokens."""
    long = [w for i, d in enumerate(docs) for w in plan_windows(len(d), target, doc=i)]
    short = [w for i, d in enumerate(docs) for w in plan_windows(len(d), original, doc=i)]
    if len(long) < 2:
        longest = max((len(d) for d in docs), default=0)
        raise ValueError(f"tune needs at least 2 windows of {target} tokens (one to rank on, one to confirm on); "
                         f"the text gives {len(long)} (longest document {longest} tokens, {len(docs)} documents): "
                         "pass more text")
    return TuneData(docs, names, digests, _split(long), _split(short))


@dataclass(frozen=True)
class TuneWindow:
    """A window's losses: ``kind`` "long" (the target length, split at L) or "short" (the original context),
    ``length`` tokens of document ``doc`` (its token ``digest``) from token ``begin``."""

    kind: str
    length: int
    doc: str
    digest: str
    begin: int

    def as_list(self) -> list:
        return [self.kind, self.length, self.doc, self.digest, self.begin]


@dataclass(frozen=True)
class TunePasskey:
    """One passkey at ``length`` tokens and ``depth``, its key drawn from ``seed``."""

    length: int
    depth: float
    seed: int

    def as_list(self) -> list:
        return ["passkey", self.length, self.depth, self.seed]


@dataclass(frozen=True)
class TuneNeedles:
    """Needles at ``depths`` in the prose of a window of ``length`` tokens of document ``doc`` (its token ``digest``)
    from token ``begin``, their words and keys drawn from ``seed``."""

    length: int
    doc: str
    digest: str
    begin: int
    seed: int
    depths: tuple[float, ...]

    def as_list(self) -> list:
        return ["needles", self.length, self.doc, self.digest, self.begin, self.seed, list(self.depths)]


def tune_cell(key: list) -> TuneWindow | TunePasskey | TuneNeedles:
    """The cell of a stored key (the inverse of ``as_list``)."""
    if key[0] == "passkey":
        return TunePasskey(*key[1:])
    if key[0] == "needles":
        return TuneNeedles(*key[1:6], tuple(key[6]))
    return TuneWindow(*key)


def kind_of(key: list) -> str:
    """The kind of a cell key: "long", "short", "passkey" or "needles"."""
    return key[0]


def sample_keys(data: TuneData, part: str, windows: int, keys: int, depths: tuple[float, ...], seed: int,
                target: int, original: int, needles: bool = False) -> list[list]:
    """The cells of one sample: the first ``windows`` windows of each length of ``part``, ``keys`` passkey
    keys per depth, and with ``needles`` a needle cell on each long window (a larger sample holds every cell of a
    smaller one)."""
    def key(kind, n, w):
        return TuneWindow(kind, n, data.names[w.doc], data.digests[w.doc], w.begin).as_list()

    out = [key("long", target, w) for w in data.long[part][:windows]]
    out += [key("short", original, w) for w in data.short[part][:windows]]
    base = seed * 1_000_003 + _PARTS[part] * 500_000
    out += [TunePasskey(target, d, base + k * len(depths) + i).as_list() for k in range(keys)
            for i, d in enumerate(depths)]
    if needles:
        out += [TuneNeedles(target, data.names[w.doc], data.digests[w.doc], w.begin, base + 400_000 + i,
                            tuple(depths)).as_list() for i, w in enumerate(data.long[part][:windows])]
    return out


class CellComputer:
    """Computes one cell of a key (the model patched as the candidate wants; run_cells times it)."""

    def __init__(self, model, tokenizer, data: TuneData, original: int, chunk_size: int = 1024):
        self.model, self.tok, self.data, self.original, self.chunk_size = model, tokenizer, data, original, chunk_size
        self.builder = PasskeyBuilder(tokenizer)
        self._docs = {(n, g): i for i, (n, g) in enumerate(zip(data.names, data.digests))}

    def __call__(self, variant, key: list) -> dict[str, Any]:
        cell = tune_cell(key)
        if isinstance(cell, TunePasskey):
            got = passkey_cell(self.model, self.tok, self.builder, cell.length, cell.depth, cell.seed, trials=1)
            return {"hits": got["hits"], "trials": got["trials"]}
        if isinstance(cell, TuneNeedles):
            doc = self.data.docs[self._docs[(cell.doc, cell.digest)]]
            return needle_cell(self.model, self.tok, doc[cell.begin : cell.begin + cell.length], cell.length,
                               cell.depths, cell.seed, self.chunk_size)
        return self._window(cell)

    def _window(self, cell: TuneWindow) -> dict[str, Any]:
        kind, n, begin = cell.kind, cell.length, cell.begin
        doc = self.data.docs[self._docs[(cell.doc, cell.digest)]]
        device = next(self.model.parameters()).device
        nll = token_nll(self.model, doc[begin : begin + n][None].to(device), chunk_size=self.chunk_size)[0].double()
        if kind == "short":
            return {"tokens": nll.numel(), "nll_sum": nll.sum().item()}
        inside = nll[: self.original - 1]  # nll[p - 1] is the loss of the token at position p
        beyond = nll[self.original - 1 :]
        edges = bucket_edges(n, BUCKETS)
        buckets = [nll[a - 1 : b - 1].sum().item() for a, b in zip(edges[:-1], edges[1:])]
        return {"inside_sum": inside.sum().item(), "inside_cnt": inside.numel(), "beyond_sum": beyond.sum().item(),
                "beyond_cnt": beyond.numel(), "bucket_sum": buckets,
                "bucket_cnt": [b - a for a, b in zip(edges[:-1], edges[1:])]}


def result_fields(key: list) -> dict[str, Any]:
    """The fields of a tune cell's result, by the kind of its key (see :meth:`CellComputer.__call__`)."""
    cell = tune_cell(key)
    if isinstance(cell, TunePasskey):
        return {"hits": NUMBER, "trials": NUMBER}
    if isinstance(cell, TuneNeedles):
        return {"answer_sum": NUMBER, "answer_cnt": NUMBER}
    if cell.kind == "short":
        return {"tokens": NUMBER, "nll_sum": NUMBER}
    return {**dict.fromkeys(("inside_sum", "inside_cnt", "beyond_sum", "beyond_cnt"), NUMBER),
            "bucket_sum": list, "bucket_cnt": list}


def _mean_exp(total: float, count: float) -> float | None:
    return math.exp(total / count) if count else None


def measure(keys: list[list], cells: list[dict[str, Any]]) -> dict[str, Any]:
    """A candidate's numbers on one sample: perplexity beyond and before L at T, perplexity of short inputs,
    passkey accuracy, the loss by position, and (with needle cells) the needle-driven perplexity; None for a number
    whose cells the sample lacks."""
    kinds = [kind_of(k) for k in keys]

    def total(kind, field):
        return sum(c[field] for k, c in zip(kinds, cells) if k == kind)

    longs = [c for k, c in zip(kinds, cells) if k == "long"]
    curve = [sum(c["bucket_sum"][i] for c in longs) / sum(c["bucket_cnt"][i] for c in longs)
             for i in range(len(longs[0]["bucket_sum"]))] if longs else []
    trials = total("passkey", "trials")
    out = {"ppl_beyond": _mean_exp(total("long", "beyond_sum"), total("long", "beyond_cnt")),
           "ppl_before": _mean_exp(total("long", "inside_sum"), total("long", "inside_cnt")),
           "ppl_short": _mean_exp(total("short", "nll_sum"), total("short", "tokens")),
           "passkey": total("passkey", "hits") / trials if trials else None, "passkey_trials": trials,
           "curve": curve}
    if "needles" in kinds:
        out["needle_ppl"] = _mean_exp(total("needles", "answer_sum"), total("needles", "answer_cnt"))
    return out


RANKABLE = ("ppl_beyond", "passkey")  # the numbers of measure() a task's objective may name
OWN = {"needle_ppl": Objective("needle_ppl", higher_is_better=False)}  # tune's own: no eval task computes it


def objectives() -> dict[str, Any]:
    """What tune can rank by (``--rank-by NAME``): the eval tasks with an objective among tune's measurements, then
    tune's own (``needle_ppl``)."""
    return {**{name: t.objective for name, t in registered().items() if t.objective is not None
               and t.objective.metric in RANKABLE}, **OWN}


def ranking(rank_by: str) -> list[Any]:
    """The objectives a candidate is ranked by: ``rank_by``'s, then the others' in registration order; an unknown
    ``rank_by`` is refused by name."""
    goals = objectives()
    if rank_by not in goals:
        raise ValueError(f"--rank-by must be one of {', '.join(goals)}, got {rank_by!r}")
    return [goals[rank_by], *(g for name, g in goals.items() if name != rank_by)]


def rank(metrics: dict[str, dict[str, Any]], baseline: dict[str, Any], max_short_cost: float,
         rank_by: str = "passkey") -> list[str]:
    """Labels best first. A candidate whose short-input perplexity is more than ``max_short_cost`` (a fraction)
    above the unpatched model's is disqualified (last). Then by the objective of the eval task ``rank_by``
    (passkey: passkey accuracy; ppl: perplexity beyond L), ties broken by the other tasks' objectives in
    registration order. Sets ``short_cost`` and ``disqualified`` on each entry."""
    order_of = ranking(rank_by)
    for m in metrics.values():
        m["short_cost"] = m["ppl_short"] / baseline["ppl_short"] - 1
        m["disqualified"] = m["short_cost"] > max_short_cost

    def value(m, goal):
        v = m[goal.metric] if m.get(goal.metric) is not None else (0.0 if goal.higher_is_better else math.inf)
        return -v if goal.higher_is_better else v

    return sorted(metrics, key=lambda label: (metrics[label]["disqualified"],
                                              *(value(metrics[label], g) for g in order_of), label))
