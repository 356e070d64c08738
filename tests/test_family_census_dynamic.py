"""The family census, length-dependent RoPE scalings (``tests/census.py``): every causal-LM family's narrow twin given
dynamic_ntk and dynamic_yarn at x2, checked as the static ones are (``test_family_census_rope.py``) and equal to the
unpatched model inside the original context. A file of its own so that the two halves run on two workers."""

from __future__ import annotations

import functools

import pytest
from census import FAMILIES, census
from test_family_census_rope import LENGTH_DEPENDENT, saved_and_read_back


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_takes_each_length_dependent_scaling_or_refuses_it_by_name(model_type, tmp_path, caplog):
    census(model_type, LENGTH_DEPENDENT, functools.partial(saved_and_read_back, tmp_path), caplog)
