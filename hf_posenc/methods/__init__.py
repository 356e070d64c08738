"""The method registry: every positional-encoding method hf_posenc knows, by canonical name.

A method is described by a :class:`MethodSpec` (its parameters, their defaults and checks); which
model families can take it is decided by the adapters (``hf_posenc.adapters``).
"""

from .spec import (  # noqa: F401  (the records and the registry, defined once in spec.py)
    REQUIRED,
    ENGINE_COMPUTES,
    EngineSupport,
    factor_grid,
    MethodSpec,
    METHODS,
    _ALIASES,
    register_method,
    unregister_method,
    on_unregister,
    resolve_method,
    MIN_ORIGINAL_CONTEXT,
    MAX_FACTOR,
    DEFAULT_FACTOR,
    check_factor,
    resolve_params,
    check_layer_types,
    positive_number,
    MAX_ATTENTION_FACTOR,
    MAX_KNOB,
)
from . import rope  # noqa: E402,F401  (registers the RoPE methods)
from . import absolute  # noqa: E402,F401  (registers the absolute-table methods)
from . import relative_bucket  # noqa: E402,F401  (registers the T5 bucket methods)
from . import swaps  # noqa: E402,F401  (registers the family swaps)
from . import remapped  # noqa: E402,F401  (registers the attention-level methods)
