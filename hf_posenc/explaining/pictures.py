"""The pictures of ``hf-posenc explain``, drawn from :mod:`.arrays` (each a PNG written whole)."""

from __future__ import annotations

import os
from typing import Any

from ..io.figures import pyplot, save_figure
from .arrays import BLENDED, FASTER, FURTHER, INTERPOLATED, UNCHANGED

CLASS_COLORS = {UNCHANGED: "tab:blue", INTERPOLATED: "tab:red", BLENDED: "tab:orange", FURTHER: "tab:purple",
                FASTER: "tab:green"}


def _marks(ax, original: int, length: int, horizontal: bool) -> None:
    line = ax.axhline if horizontal else ax.axvline
    line(original, color="grey", linestyle="--", linewidth=1, label=f"original context L = {original:,}")
    if length != original:
        line(length, color="black", linestyle=":", linewidth=1, label=f"target length {length:,}")


def _finish(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: str) -> str:
    """Labels, title, grid and legend of a one-axes picture, written to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return save_figure(plt, fig, path)


def wavelengths(w: dict[str, Any], title: str, path: str) -> str:
    """Wavelength per rotary dimension pair before and after, each after-point coloured by its class."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=120)
    k = list(range(len(w["wavelength_before"])))
    ax.plot(k, w["wavelength_before"].tolist(), color="lightgrey", linewidth=2.5, label="before (the model's own)")
    ax.plot(k, w["wavelength_after"].tolist(), color="black", linewidth=0.8)
    for name, color in CLASS_COLORS.items():
        idx = [i for i, c in enumerate(w["classes"]) if c == name]
        if idx:
            ax.scatter(idx, [w["wavelength_after"][i].item() for i in idx], s=12, color=color, zorder=3,
                       label=f"after: {name} ({len(idx)})")
    _marks(ax, w["original"], w["length"], horizontal=True)
    ax.set_yscale("log")
    ax.set_xlabel("rotary dimension pair k (high frequency -> low)")
    ax.set_ylabel("wavelength 2*pi/theta_k (tokens)")
    ax.set_title(title + f"\nattention temperature {w['attention']:.4f}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    return save_figure(plt, fig, path)


def decay(series: dict[str, tuple[Any, Any]], original: int, length: int, title: str, path: str) -> str:
    """RoPE's relative upper bound against distance, one line per frequency set."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    for label, (d, bound) in series.items():
        ax.plot(d.tolist(), bound.tolist(), linewidth=1, label=label)
    _marks(ax, original, length, horizontal=False)
    ax.set_xscale("log")
    return _finish(plt, fig, ax, "relative distance (tokens)", "relative upper bound (1/(d/2)) sum |S_j|", title, path)


def remapped(m: dict[str, Any], title: str, path: str) -> str:
    """Left: the relative position each (query, key) sees; right: the last query's row against true distance."""
    import numpy as np

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=120)
    n, L, T = m["length"], m["original"], m["length"]
    grid = m["map"].numpy()
    im = left.imshow(np.ma.masked_invalid(grid), origin="upper", cmap="viridis", extent=(0, n, n, 0),
                     interpolation="nearest", vmin=0, vmax=max(L, m["largest"]))
    if np.nanmax(grid) >= L:
        left.contour(np.linspace(0, n, grid.shape[1]), np.linspace(0, n, grid.shape[0]), np.nan_to_num(grid, nan=-1),
                     levels=[L - 0.5], colors="red", linewidths=1)
    fig.colorbar(im, ax=left, label="relative position seen")
    left.set_xlabel("key position")
    left.set_ylabel("query position")
    left.set_title("relative position per (query, key)" + (" -- red: L" if np.nanmax(grid) >= L else ""), fontsize=9)
    row = m["last_row"]
    d = (len(row) - 1 - np.arange(len(row)))[::-1]
    right.plot(d, row.numpy()[::-1], color="tab:red", linewidth=1, label="seen by the method")
    right.plot(d, d, color="grey", linestyle="--", linewidth=1, label="true distance (no method)")
    right.axhline(L, color="black", linestyle=":", linewidth=1, label=f"L = {L:,}")
    right.set_xlabel(f"true distance from the last query (position {T - 1:,})")
    right.set_ylabel("relative position seen")
    right.set_title(f"largest position any key takes: {m['largest']:,.0f} (L = {L:,})", fontsize=9)
    right.grid(alpha=0.3)
    right.legend(fontsize="small")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def buckets(b: dict[str, Any], title: str, path: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    d = b["distance"].tolist()
    ax.step(d, b["before"].tolist(), where="post", color="grey",
            label=f"before (max_distance {b['max_distance_before']})")
    ax.step(d, b["after"].tolist(), where="post", color="tab:red",
            label=f"after (max_distance {b['max_distance_after']})")
    for key, color, label in (("last_shared_before", "grey", "before: one shared bucket from"),
                              ("last_shared_after", "tab:red", "after: from")):
        if b[key] is not None:
            ax.axvline(b[key], color=color, linestyle=":", linewidth=1, label=f"{label} {b[key]:,}")
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlim(left=0)
    return _finish(plt, fig, ax, "distance of the key before the query (tokens)", "bucket", title, path)


def alibi(a: dict[str, Any], original: int, title: str, path: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    for h, slope in enumerate(a["slopes"].tolist()):
        ax.plot(a["distance"].tolist(), a["bias"][h].tolist(), linewidth=1, label=f"head {h}: slope {slope:.3g}")
    ax.axvline(original, color="grey", linestyle="--", linewidth=1, label=f"L = {original:,}")
    ax.set_xlabel("distance (tokens)")
    ax.set_ylabel("bias added to the score")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2 if len(a["slopes"]) > 8 else 1)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def similarity(t: dict[str, Any], title: str, path: str) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), dpi=120)
    for ax, key, label in ((axes[0], "similarity_before", "before"), (axes[1], "similarity_after", "after")):
        im = ax.imshow(t[key].numpy(), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(f"{label}: {t[key].shape[0]:,} positions", fontsize=9)
        ax.set_xlabel("position")
        ax.set_ylabel("position")
    fig.colorbar(im, ax=axes, label="cosine similarity of the position vectors")
    fig.suptitle(title, fontsize=10)
    return save_figure(plt, fig, path)


def path_in(output: str, name: str) -> str:
    return os.path.join(output, name)

