"""``hf-posenc tune``: measure, don't guess -- the method and knobs for a model at a target length."""

from .search import tune

__all__ = ["tune"]
