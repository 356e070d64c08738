"""Methods on T5-style relative-position buckets (training-free)."""

from __future__ import annotations

from .spec import MethodSpec, register_method

register_method(MethodSpec(
    "bucket_scale", "relative_bucket",
    "Relative positions divided by factor (toward zero) before T5's bucketing: position interpolation for buckets."))
register_method(MethodSpec(
    "max_distance", "relative_bucket",
    "relative_attention_max_distance x factor: T5's log-spaced buckets stretched over longer distances.",
    aliases=("bucket_max_distance",)))
