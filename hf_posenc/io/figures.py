"""matplotlib, headless, and a figure written whole: what every picture of hf_posenc is drawn with."""

from __future__ import annotations

from .files import atomic_write


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: str) -> str:
    """The figure as a PNG at ``path``, written atomically (a reader never sees half a picture); closed."""
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png"))
    finally:
        plt.close(fig)
    return path
