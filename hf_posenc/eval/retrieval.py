"""Long-document needle retrieval for sentence-embedding encoders (BERT family).

Each trial builds ``candidates`` documents of ``length`` tokens from a passage of a corpus (the same
passage for all candidates by default, so that only the fact tells them apart; ``filler="different"``
gives each its own passage); each holds one fact about a different person ("The secret code of agent
Maria is ruby-castle.") at the same depth. The query asks for one person's fact ("What is the secret code of agent
Maria?"). The documents and the query are embedded (mean pooling over tokens, L2-normalised, as sentence-transformers
does for all-MiniLM-L6-v2); the trial is a hit when the document holding that person's fact is the
nearest. Documents longer than what the model takes are truncated to its positions (``none`` on a
512-position BERT: what users do today), so a fact past the cut is lost; candidates that become
identical tie, and ties count as a random draw (a hit worth 1/ties).

Reported per length: top-1 accuracy and mean reciprocal rank, overall and per depth.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ..checkpoints.context import context_length

NAMES = ["Maria", "Tomas", "Aiko", "Kwame", "Lena", "Ravi", "Sofia", "Omar", "Ingrid", "Mateo", "Yara", "Hugo",
         "Nadia", "Felix", "Amara", "Jonas", "Leila", "Bruno", "Freya", "Diego", "Hana", "Ivan", "Zara", "Pablo"]
WORDS = ["ruby", "castle", "falcon", "maple", "harbor", "violet", "thunder", "lantern", "copper", "meadow",
         "glacier", "orchid", "anchor", "saffron", "comet", "willow", "ember", "quartz", "canyon", "pepper"]
FACT = " The secret code of agent {name} is {code}. "
QUERY = "What is the secret code of agent {name}?"


@torch.no_grad()
def embed(model, ids: list[list[int]], limit: int, pad_id: int) -> torch.Tensor:
    """Mean-pooled, normalised embeddings of token id lists, each cut to ``limit`` tokens."""
    device = next(model.parameters()).device
    rows = [r[:limit] for r in ids]
    width = max(len(r) for r in rows)
    x = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    x, mask = x.to(device), mask.to(device)
    hidden = model(input_ids=x, attention_mask=mask).last_hidden_state.float()
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return torch.nn.functional.normalize(pooled, dim=-1).cpu()


class NeedleDocs:
    """Builds the documents and queries from a token stream (the corpus, tokenized once)."""

    def __init__(self, tokenizer, stream: list[int]):
        self.tok = tokenizer
        self.stream = stream
        self.cls = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else []
        self.sep = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []

    def enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def filler(self, n: int, rng: random.Random) -> list[int]:
        if len(self.stream) < n + 1:
            raise ValueError(f"too little corpus text: {len(self.stream)} tokens for documents of {n} filler tokens")
        start = rng.randrange(0, len(self.stream) - n)
        return self.stream[start : start + n]

    def document(self, length: int, depth: float, fact: list[int], filler: list[int]) -> list[int]:
        body = length - len(self.cls) - len(self.sep) - len(fact)
        if body < 1:
            raise ValueError(f"length {length} is too short for a needle document (fact: {len(fact)} tokens)")
        filler = filler[:body]
        at = round(depth * body)
        return self.cls + filler[:at] + fact + filler[at:] + self.sep

    def query(self, name: str) -> list[int]:
        return self.cls + self.enc(QUERY.format(name=name)) + self.sep


def expected_rank_scores(scores: torch.Tensor, target: int, tol: float = 1e-6) -> tuple[float, float]:
    """(hit, reciprocal rank) of ``target``, ties broken at random (their expectation)."""
    s_t = scores[target]
    better = int((scores > s_t + tol).sum())
    ties = int(((scores - s_t).abs() <= tol).sum())
    hit = 1.0 / ties if better == 0 else 0.0
    rr = sum(1.0 / (better + k) for k in range(1, ties + 1)) / ties
    return hit, rr


def check_retrieval(depths: list[float], trials: int, candidates: int, filler: str) -> None:
    if not 2 <= candidates <= len(NAMES):
        raise ValueError(f"candidates must be in [2, {len(NAMES)}], got {candidates}")
    if filler not in ("same", "different"):
        raise ValueError(f"filler must be 'same' or 'different', got {filler!r}")
    if trials < 1 or any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"trials must be >= 1 and depths in [0, 1], got trials={trials}, depths={depths}")


def grid(lengths: list[int], depths: list[float], seed: int) -> list[tuple[int, float, int]]:
    """(length, depth, document seed) per cell: the same documents for every method."""
    return [(n, d, seed * 1_000_003 + li * 1009 + di) for li, n in enumerate(lengths) for di, d in enumerate(depths)]


def retrieval_cell(model, tokenizer, builder: NeedleDocs, length: int, depth: float, doc_seed: int, trials: int,
                   candidates: int = 5, filler: str = "same") -> dict:
    """``trials`` queries, each ranking ``candidates`` documents of ``length`` tokens (the fact at ``depth``)."""
    limit = context_length(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rng = random.Random(doc_seed)
    hits, rr = 0.0, 0.0
    for _ in range(trials):
        names = rng.sample(NAMES, candidates)
        facts = [builder.enc(FACT.format(name=n, code=f"{rng.choice(WORDS)}-{rng.choice(WORDS)}")) for n in names]
        shared = builder.filler(length, rng)
        docs = [builder.document(length, depth, f, shared if filler == "same" else builder.filler(length, rng))
                for f in facts]
        target = rng.randrange(candidates)
        d_emb = embed(model, docs, limit, pad)
        q_emb = embed(model, [builder.query(names[target])], limit, pad)[0]
        hit, recip = expected_rank_scores(d_emb @ q_emb, target)
        hits += hit
        rr += recip
    return {"hits": hits, "rr": rr, "trials": trials, "positions": limit}


def aggregate_retrieval(lengths: list[int], cells: list[tuple[int, float, dict]]) -> dict[str, Any]:
    limit = cells[0][2]["positions"]  # the tokens the (patched) model reads
    out: dict[str, Any] = {"positions": limit, "by_length": {}}
    for n in lengths:
        per = {f"{d:g}": {"accuracy": c["hits"] / c["trials"], "mrr": c["rr"] / c["trials"], "trials": c["trials"]}
               for m, d, c in cells if m == n}
        out["by_length"][str(n)] = {
            "accuracy": sum(c["accuracy"] for c in per.values()) / len(per),
            "mrr": sum(c["mrr"] for c in per.values()) / len(per), "truncated_to": min(limit, n), "depths": per,
        }
    return out
