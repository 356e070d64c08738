"""The method registry: every positional-encoding method hf_posenc knows, by canonical name.

A method is described by a :class:`MethodSpec` (its parameters, their defaults and checks); which
model families can take it is decided by the adapters (``hf_posenc.adapters``).
"""

from .spec import (  # noqa: F401  (the records and the registry, defined once in spec.py)
    _ALIASES,
    DEFAULT_FACTOR,
    ENGINE_COMPUTES,
    MAX_ATTENTION_FACTOR,
    MAX_FACTOR,
    MAX_KNOB,
    METHODS,
    MIN_ORIGINAL_CONTEXT,
    REQUIRED,
    EngineSupport,
    MethodSpec,
    check_factor,
    check_layer_types,
    factor_grid,
    on_unregister,
    positive_number,
    register_method,
    resolve_method,
    resolve_params,
    unregister_method,
)

# each module registers its methods when imported, in this order (the order the methods are listed in)
# isort: off
from . import rope  # noqa: E402,F401  (registers the RoPE methods)
from . import absolute  # noqa: E402,F401  (registers the absolute-table methods)
from . import relative_bucket  # noqa: E402,F401  (registers the T5 bucket methods)
from . import swaps  # noqa: E402,F401  (registers the family swaps)
from . import remapped  # noqa: E402,F401  (registers the attention-level methods)
# isort: on

# the methods hf_posenc ships (the family census runs each of them; one registered later is not in its record)
BUILT_IN = frozenset(METHODS)
