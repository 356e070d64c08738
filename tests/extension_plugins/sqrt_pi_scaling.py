"""A RoPE scaling added from outside the package, as a plugin would: PI by the square root of the factor, with every
fact its record holds (tune grid, what engines compute, its native transformers form, how a GGUF holds it), and a
length-dependent sibling whose record says how it freezes and why context parallelism refuses it. One file, public
registration only (:func:`hf_posenc.methods.rope.register_scaling`, :func:`hf_posenc.methods.unregister_method`)."""

import math

from hf_posenc.encodings.rope import default_inv_freq
from hf_posenc.methods import EngineSupport, MethodSpec, factor_grid, unregister_method
from hf_posenc.methods.rope import RopeScaling, register_scaling

NAME = "sqrt_pi"
GROW = "sqrt_pi_grow"


def rope_sqrt_pi(geom, factor, params, seq_len=None, device=None):
    """Position interpolation by the square root of the factor (every theta_i / sqrt(s)), in float32."""
    return default_inv_freq(geom.base, geom.dim, device) / math.sqrt(factor), 1.0


def register() -> None:
    """Register both scalings (a test removes them again with :func:`unregister`)."""
    spec = MethodSpec(NAME, "rope", "PI by the square root of the factor (a test's scaling).",
                      tune_grid=factor_grid,
                      engines={"vLLM": EngineSupport("within_original", "a test's claim", caveat="a test's caveat")})
    register_scaling(spec, RopeScaling(
        rope_sqrt_pi, native=lambda s, L, p, g: {"rope_type": "linear", "factor": math.sqrt(s)},
        gguf=lambda s, L, p, g: ({"type": "linear", "factor": math.sqrt(s)}, None)))
    grow = MethodSpec(GROW, "rope", "sqrt_pi by the length seen (a test's scaling).")
    register_scaling(grow, RopeScaling(
        rope_sqrt_pi, dynamic="grow", follows_length="its factor follows the length seen",
        freeze=lambda s, L, p, at: (math.sqrt(at / L), {}), freezes_to="pi", unchanged_within_original=lambda p: True))


def unregister() -> None:
    for name in (NAME, GROW):
        unregister_method(name)
