"""The report of ``hf-posenc tune --search evolution``: the best per generation, the finalists on the larger sample
(with the rank agreement of the cheaper one), the confirmation on unseen data, and three plots (best per generation,
the winner's factors beside PI's, NTK's and YaRN's, the loss by position)."""

from __future__ import annotations

import os
from typing import Any

from ..eval.perplexity import bucket_edges
from ..io.reports import markdown_table, plot_lines
from .objective import BUCKETS
from .report import passkey_text

RANK_NAMES = {"ppl": ("ppl_beyond", "perplexity beyond the original context"),
              "needle_ppl": ("needle_ppl", "needle-driven perplexity (the answer tokens of needles in prose)")}


def _num(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cost(m: dict[str, Any]) -> str:
    cost = m.get("short_cost")
    return "-" if cost is None else f"{100 * cost:+.2f}%"


def _columns(m: dict[str, Any]) -> list[str]:
    return [_num(m.get("ppl_beyond")), _num(m.get("needle_ppl")), passkey_text(m), _num(m.get("ppl_short"), 3),
            _cost(m)]


def _context(s: dict[str, Any]) -> int:
    """The context the search extends (a pinned original_max_position_embeddings, else the model's)."""
    return s.get("extended_context") or s["original_context"]


def _head(s: dict[str, Any]) -> list[str]:
    L = _context(s)
    return [f"ppl beyond {L}", "needle ppl", "passkey (keys)", f"ppl at {L}", "short-input cost"]


def _origin(res: dict[str, Any], label: str) -> str:
    return res["candidates"].get(label, {}).get("origin", "")


def generation_rows(res: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for g in res["generations"]:
        best = g["best"]
        rows.append([g["generation"], len(g["candidates"]), len(g["new"]), best, _origin(res, best),
                     *_columns(res["metrics"][best])])
    return rows


def evolution_table(report: dict[str, Any]) -> str:
    s, res = report["setup"], report["results"]
    metric, wording = RANK_NAMES[s["rank_by"]]
    evo = s["evolution"]
    head = _head(s)
    held = {"critical": "below the critical dimension", "yarn": "that YaRN leaves unchanged", "none": ""}[evo["hold"]]
    note = (f"Searched longrope factors for {s['target_length']} tokens on {s['model']} (context extended "
            f"{_context(s)}, extension ratio {res['factor']:g}): {evo['population']} candidates x up to "
            f"{evo['generations']} generations, ranked by {wording}; "
            + (f"the {res['free_from']} pairs {held} kept at 1; " if res["free_from"] else "every pair searched; ")
            + f"candidates more than {100 * s['max_short_cost']:g}% worse than the unpatched "
            f"model on inputs of {_context(s)} tokens are disqualified. {res['evaluations']} candidates "
            f"measured{' (stopped by the budget)' if res['stopped_by_budget'] else ''}{_cost_note(s)}. "
            f"Data: {', '.join(s['documents'])}.")
    gens = markdown_table(["generation", "candidates", "new", "best", "from", *head], generation_rows(res))
    fin = res["finalists"]
    tau = "-" if fin["kendall_tau"] is None else f"{fin['kendall_tau']:+.2f}"
    finals = markdown_table(["rank", "candidate", "from", "rank on the cheaper sample", *head],
                            [[i + 1, label, _origin(res, label), fin["proxy_ranking"].index(label) + 1,
                              *_columns(fin["metrics"][label])] for i, label in enumerate(fin["ranking"])])
    parts = [note, f"**Best per generation** (calibration, {fin['proxy_windows']} window(s) of each length)", gens,
             f"**Finalists** on {fin['windows']} window(s) of each length; Kendall's tau between this ranking and the "
             f"generations' on {fin['proxy_windows']} window(s): {tau} (the larger sample holds the smaller one, so "
             "the agreement is an upper bound)", finals, _confirmed(res, head)]
    return "\n\n".join(parts)


def _cost_note(s: dict[str, Any]) -> str:
    compute = s.get("compute")
    if not compute:
        return ""
    return (f"; the search cost {compute['cells']} cells (one forward pass each) in {compute['seconds']:.1f} s of "
            "compute")


def _confirmed(res: dict[str, Any], head: list[str]) -> str:
    conf = res["confirmation"]
    if not conf["metrics"]:
        return "No candidate stayed within the short-input cost: nothing to confirm, no best.json."
    ref = (res.get("reference") or {}).get("label")
    order = [label for label in (res["best"], res["runner_up"], ref) if label in conf["metrics"]]
    rows = [["none (unpatched)", *_columns(conf["baseline"])]]
    rows += [[label, *_columns(conf["metrics"][label])] for label in order]
    rows = [[f"{r[0]} (reference: YaRN, default knobs)" if r[0] == ref else r[0], *r[1:]] for r in rows]
    text = (f"**Confirmation** (data never used for ranking: {conf['windows']} window(s) of each length, "
            f"{conf['keys_per_depth']} passkey key(s) per depth)\n\n" + markdown_table(["candidate", *head], rows))
    everywhere = conf.get("long_everywhere")
    if everywhere:
        text += (f"\n\nInputs up to the original context take the short factors (the checkpoint's own) in "
                 f"transformers; an engine that picks the long factors for every input (vLLM with --max-model-len "
                 f"past the original context, a GGUF) costs them {100 * everywhere['short_cost']:+.2f}% "
                 f"(perplexity {everywhere['ppl_short']:.3f} at the original length).")
    return text


def evolution_plots(report: dict[str, Any], output: str) -> list[str]:
    s, res = report["setup"], report["results"]
    metric, wording = RANK_NAMES[s["rank_by"]]
    paths = []
    gens = [g["generation"] for g in res["generations"]]
    values = [res["metrics"][g["best"]][metric] for g in res["generations"]]
    series = {"best so far": (gens, values),
              "unpatched": (gens, [res["baseline"][metric]] * len(gens))}
    paths.append(plot_lines(series, f"Evolutionary search at {s['target_length']} tokens: best per generation",
                            "generation", wording.split(" (")[0], os.path.join(output, "tune_generations.png"),
                            baseline="unpatched"))
    best = res["best"] or res["finalists"]["ranking"][0]
    pairs = list(range(len(res["candidates"][best]["factors"])))
    lines = {f"searched ({best})": (pairs, res["candidates"][best]["factors"])}
    lines.update({f"{m} x{res['factor']:g}": (pairs, f) for m, f in res["seed_factors"].items()})
    paths.append(plot_lines(lines, "Rescale factor per rotary pair (0 = highest frequency)", "rotary pair",
                            "factor (frequency divisor)", os.path.join(output, "tune_factors.png"), logy=True))
    edges = bucket_edges(s["target_length"], BUCKETS)
    xs = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    fin = res["finalists"]
    curves = {"none (unpatched)": (xs, fin["baseline"]["curve"])}
    curves.update({label: (xs, fin["metrics"][label]["curve"]) for label in fin["ranking"][:3]})
    paths.append(plot_lines(curves, f"Loss by position at {s['target_length']} tokens: the finalists",
                            "position in window", "mean NLL (nats)", os.path.join(output, "tune_loss_by_position.png"),
                            vline=_context(s)))
    return paths
