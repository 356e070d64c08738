"""The tune report: the ranked table, the confirmation, the loss-by-position plot, and ``best.json``."""

from __future__ import annotations

import json
import os
from typing import Any

from ..config import PosEncConfig
from ..eval.common import BEST
from ..eval.perplexity import bucket_edges
from ..io.files import atomic_write_text
from ..io.reports import markdown_table, plot_lines
from .objective import BUCKETS

TOP_PLOTTED = 3


def passkey_text(m: dict[str, Any]) -> str:
    """A candidate's passkey accuracy and its number of keys, as the tables show it ("-" when not measured)."""
    return "-" if m.get("passkey") is None else f"{m['passkey']:.2f} ({m['passkey_trials']})"


def _row(label: str, m: dict[str, Any], *extra: Any) -> list[Any]:
    cost = m.get("short_cost")
    needles = [] if "needle_ppl" not in m else ["-" if m["needle_ppl"] is None else f"{m['needle_ppl']:.2f}"]
    return [label, *extra, *needles, passkey_text(m), f"{m['ppl_beyond']:.2f}", f"{m['ppl_short']:.3f}",
            "-" if cost is None else f"{100 * cost:+.2f}%"]


RANKED_BY = {"passkey": "passkey accuracy, then perplexity beyond the original context",
             "ppl": "perplexity beyond the original context, then passkey accuracy",
             "needle_ppl": "needle-driven perplexity (the answer tokens of needles in prose), then perplexity beyond "
                           "the original context, then passkey accuracy"}


def _status(label: str, res: dict[str, Any], m: dict[str, Any]) -> str:
    if label == res["best"]:
        return "**best**"
    if label == res["runner_up"]:
        return "runner-up"
    if m["disqualified"]:
        return "disqualified (short inputs)"
    last = res["rungs"][-1]["rung"]
    return "kept" if res["reached"][label] == last else f"out after rung {res['reached'][label]}"


def ranked_rows(res: dict[str, Any]) -> list[list[Any]]:
    """Every candidate, at the last rung it reached, best first."""
    rows, seen = [], set()
    for r in reversed(res["rungs"]):
        for label in r["ranking"]:
            if label not in seen:
                seen.add(label)
                rows.append(_row(label, r["metrics"][label], r["rung"], _status(label, res, r["metrics"][label])))
    return [[i + 1, *row] for i, row in enumerate(rows)]


def _rung_data(r: dict[str, Any], s: dict[str, Any]) -> str:
    return f"{r['rung']}: {r['windows']} window(s), {r['keys_per_depth']} key(s) x {len(s['depths'])} depths"


def tune_table(report: dict[str, Any]) -> str:
    s, res = report["setup"], report["results"]
    head = ["candidate", *(["needle ppl"] if s["rank_by"] == "needle_ppl" else []), "passkey (keys)",
            f"ppl beyond {s['original_context']}", f"ppl at {s['original_context']}", "short-input cost"]
    last = res["rungs"][-1]
    note = (f"Tuned for {s['target_length']} tokens on {s['model']} (original context {s['original_context']}), "
            f"ranked by {RANKED_BY[s['rank_by']]}; "
            f"candidates more than {100 * s['max_short_cost']:g}% worse than the unpatched model on inputs of "
            f"{s['original_context']} tokens are disqualified. Data: {', '.join(s['documents'])}. "
            f"{len(res['rungs'])} rung(s) of successive halving"
            f"{' (stopped by the budget)' if res['stopped_by_budget'] else ''}.")
    calib = markdown_table(["rank", head[0], "rung", "status", *head[1:]], ranked_rows(res))
    baseline = markdown_table([head[0], "rung", *head[1:]],
                              [_row("none (unpatched)", r["baseline"], _rung_data(r, s)) for r in res["rungs"]])
    conf = res["confirmation"]
    if conf["metrics"]:
        rows = [_row(label, conf["metrics"][label]) for label in (res["best"], res["runner_up"]) if label]
        ref = (res.get("reference") or {}).get("label")
        if ref in conf["metrics"] and ref not in (res["best"], res["runner_up"]):
            rows.append(_row(f"{ref} (reference: YaRN, default knobs)", conf["metrics"][ref]))
        confirmed = markdown_table(head, [_row("none (unpatched)", conf["baseline"]), *rows])
    else:
        confirmed = "No candidate stayed within the short-input cost: nothing to confirm, no best.json."
    return (f"{note}\n\n**Calibration** (ranking data, rung {last['rung']}: {last['windows']} window(s) of each "
            f"length, {last['keys_per_depth']} key(s) x {len(s['depths'])} depths; each candidate's numbers come from "
            f"the last rung it reached)\n\n{calib}\n\nUnpatched, on each rung's data:\n\n"
            f"{baseline}\n\n**Confirmation** (data never used for ranking: {conf['windows']} window(s) of each "
            f"length, {conf['keys_per_depth']} key(s) x {len(s['depths'])} depths)\n\n{confirmed}")


def tune_plots(report: dict[str, Any], output: str) -> list[str]:
    s, res = report["setup"], report["results"]
    last = res["rungs"][-1]
    edges = bucket_edges(s["target_length"], BUCKETS)
    xs = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    series = {"none (unpatched)": (xs, last["baseline"]["curve"])}
    series.update({label: (xs, last["metrics"][label]["curve"]) for label in last["ranking"][:TOP_PLOTTED]})
    return [plot_lines(series, f"Loss by position at {s['target_length']} tokens: top candidates",
                       "position in window", "mean NLL (nats)", os.path.join(output, "tune_loss_by_position.png"),
                       vline=s["original_context"])]


def write_best(report: dict[str, Any], output: str) -> str | None:
    """``best.json``: the winner's PosEncConfig (``hf-posenc patch --config``), when there is one; else an earlier
    run's ``best.json`` in this output goes (it would be taken for this run's winner)."""
    best = report["results"]["best"]
    path = os.path.join(output, BEST)
    if best is None:
        if os.path.isfile(path):
            os.unlink(path)
        return None
    atomic_write_text(path, PosEncConfig.from_dict(report["results"]["configs"][best]).to_json() + "\n")
    return path


def tune_report_beside(config_path: str) -> dict[str, Any] | None:
    """The ``tune.json`` in the folder of ``config_path`` when its winner is that configuration (so the model card
    of a checkpoint patched from ``best.json`` says how it was chosen); else None."""
    path = os.path.join(os.path.dirname(os.path.abspath(config_path)), "tune.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    with open(config_path, encoding="utf-8") as f:
        config = PosEncConfig.from_json(f.read())
    res = report.get("results", {})
    best = res.get("best")
    if best is None or PosEncConfig.from_dict(res["configs"][best]) != config:
        return None
    return report
