"""Small statistics for reports: means with 95% intervals across documents."""

from __future__ import annotations

import math

# two-sided 95% Student t quantiles, by degrees of freedom (1..30); 1.96 beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def mean_ci95(values: list[float]) -> tuple[float, float | None, float | None]:
    """Mean and a Student-t 95% interval; the interval is None with fewer than two values."""
    n = len(values)
    if n == 0:
        return math.nan, None, None
    m = sum(values) / n
    if n < 2:
        return m, None, None
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return m, m - half, m + half
