"""Results as JSON, Markdown tables and PNG plots."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from typing import Any

from .figures import pyplot, save_figure
from .files import atomic_write_text
from .provenance import scrub, scrub_data
from .wording import first_names


def finite(data: Any, where: str = "", found: list[str] | None = None) -> Any:
    """``data`` (JSON-like) with every NaN or infinity replaced by None (JSON's null); their paths are appended
    to ``found``."""
    if isinstance(data, float) and not math.isfinite(data):
        if found is not None:
            found.append(where or "(the value)")
        return None
    if isinstance(data, dict):
        return {k: finite(v, f"{where}.{k}" if where else str(k), found) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v, f"{where}[{i}]", found) for i, v in enumerate(data)]
    return data


def write_json(data: dict[str, Any], path: str) -> str:
    """``data`` as standard JSON at ``path`` (a NaN or infinity is written as null, with a warning naming it),
    scrubbed of secrets, written atomically (the old file or the new one, never half of one)."""
    found: list[str] = []
    clean = finite(scrub_data(data), found=found)
    if found:
        shown = first_names(found)
        print(f"hf-posenc: warning: {os.path.basename(path)}: {len(found)} value(s) are not finite numbers (NaN or "
              f"infinite: the computation overflowed) and are written as null: {shown}", file=sys.stderr)
    atomic_write_text(path, json.dumps(clean, indent=2, allow_nan=False))
    return path


def save_report(report: dict[str, Any], output: str, stem: str, plots=None) -> None:
    """``<stem>.json`` (everything) and ``<stem>.md`` (the table) in ``output``, then the plots if asked."""
    os.makedirs(output, exist_ok=True)
    write_json(report, os.path.join(output, f"{stem}.json"))
    atomic_write_text(os.path.join(output, f"{stem}.md"), scrub(report["table"]) + "\n")
    if plots is not None:
        report["plots"] = plots(report, output)


NOT_RECORDED = "not recorded"  # the device of a cell computed before cells recorded theirs


def device_counts(devices: dict[str, int]) -> str:
    """Cell counts by device in words: ``"6 on cpu, 1 on cuda (NVIDIA H100 80GB HBM3), 1 not recorded"``."""
    return ", ".join(f"{n} {device}" if device == NOT_RECORDED else f"{n} on {device}"
                     for device, n in sorted(devices.items()))


def _scaling_note(setup: dict[str, Any]) -> str:
    """Lines under the table for each variant that changed a checkpoint whose RoPE was already scaled: whether it
    extended that scaling from the checkpoint's context (computed as the composed configuration) or replaced it."""
    variants = setup.get("variants", {})
    lines = [_scaling_line(label, variants.get(label, {}).get("method", label), now)
             for label, now in (setup.get("applied") or {}).items() if now.get("own_scaling")]
    return "".join(f"\n\n{line}" for line in lines)


def _scaling_line(label: str, asked: str, now: dict[str, Any]) -> str:
    """The line of :func:`_scaling_note` for the variant ``label`` (method ``asked``), applied as ``now`` says."""
    own = now["own_scaling"]
    pretrained = f", pretrained for {own['pretrained_context']} tokens" if own["pretrained_context"] else ""
    what = (f"{label}: the checkpoint's RoPE is already scaled ({own['rope_type']}{pretrained}, a context of "
            f"{own['context']})")
    if own["replaced"]:
        return f"{what}; {asked} replaced that scaling, scaling from the pretraining context to {now['context']} " \
               "tokens."
    return (f"{what}; {asked} extends it from {own['context']} to {now['context']} tokens (computed as "
            f"{now['config']['method']}: inputs up to {own['context']} keep the checkpoint's frequencies).")


def _devices_note(setup: dict[str, Any]) -> str:
    """A line under the table when the cells of a resumed run were computed on more than one device."""
    devices = setup.get("compute", {}).get("devices", {})
    if len(devices) < 2:
        return ""
    return f"\n\nCells computed: {device_counts(devices)}; this call ran on {setup.get('device')}."


def finish_report(task: str, setup: dict[str, Any], results: dict[str, Any], table, output: str | None = None,
                  plots=None) -> dict[str, Any]:
    """An evaluation runner's report ``{task, setup, results, table}`` (``table(report)`` gives the Markdown
    table), saved as ``<task>.json`` / ``<task>.md`` (and ``plots(report, output)``) when ``output`` is given."""
    report = {"task": task, "setup": setup, "results": results}
    report["table"] = table(report) + _scaling_note(setup) + _devices_note(setup)
    if output:
        save_report(report, output, task, plots)
    return report


BENCHMARKS_HEADER = "# Benchmarks\n\nEvery number below comes from the command printed with it.\n"


def replace_markdown_section(path: str, text: str, header: str = BENCHMARKS_HEADER) -> None:
    """Put ``text`` (starting with a ``## `` heading) into the Markdown file ``path``: in place of the
    section with the same heading when there is one, else at the end. Other sections are kept."""
    old = open(path).read() if os.path.exists(path) else header
    heading = text.splitlines()[0]
    if not heading.startswith("## "):
        raise ValueError(f"a section must start with a '## ' heading, got {heading!r}")
    at = old.find(heading + "\n")
    if at != -1:
        nxt = old.find("\n## ", at + 1)
        old = old[:at] + (old[nxt + 1:] if nxt != -1 else "")
        if nxt != -1:  # keep the section where it was
            old = old[:at] + text.rstrip() + "\n\n" + old[at:]
            with open(path, "w") as f:
                f.write(old.rstrip() + "\n")
            return
    with open(path, "w") as f:
        f.write(old.rstrip() + "\n\n" + text.rstrip() + "\n")


def emit_section(text: str, write: bool, benchmarks_md: str) -> None:
    """Print a benchmark script's section and, when ``write``, put it into ``benchmarks_md``."""
    print(text)
    if write:
        replace_markdown_section(benchmarks_md, text)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.2e}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def plot_lines(series: dict[str, tuple[list[float], list[float]]], title: str, xlabel: str, ylabel: str, path: str,
               logy: bool = False, vline: float | None = None, hline: tuple[float, str] | None = None,
               baseline: str | None = None) -> str:
    """One line per series; ``baseline`` names the series drawn as a black dashed reference line."""
    plt = pyplot()
    many = len(series) > 4  # then the legend goes beside the axes, where it hides no line
    fig, ax = plt.subplots(figsize=(9.5 if many else 7, 4.2), dpi=120)
    for label, (xs, ys) in series.items():
        style = {"color": "black", "linestyle": "--"} if label == baseline else {}
        ax.plot(xs, ys, marker="o", markersize=3, label=label, **style)
    if vline:
        ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label="original context")
    if hline:
        ax.axhline(hline[0], color="firebrick", linestyle=":", linewidth=1, label=hline[1])
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(**({"loc": "upper left", "bbox_to_anchor": (1.01, 1), "fontsize": "small"} if many else {}))
    fig.tight_layout()
    return save_figure(plt, fig, path)


def plot_heatmap(matrix: list[list[float]], rows: list[str], cols: list[str], title: str, path: str,
                 xlabel: str = "context length (tokens)", ylabel: str = "needle depth") -> str:
    plt = pyplot()
    width = max(1.2 + 1.1 * len(cols), 3.6)  # at least wide enough for a readable title
    fig, ax = plt.subplots(figsize=(width, 1.3 + 0.5 * len(rows)), dpi=120)
    im = ax.imshow(matrix, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, int(width * 8), break_on_hyphens=False), fontsize="medium")  # a long label wraps
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    return save_figure(plt, fig, path)
