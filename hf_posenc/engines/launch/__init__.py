"""``hf-posenc serve-config``: the launch settings under which each serving engine computes what hf_posenc
computes for a saved checkpoint (or GGUF), or the sentence that says it cannot and why.

One module per engine, each a function ``launch(served, length) -> Launch`` in the engine's record, which the module
registers (:func:`hf_posenc.engines.registry.register_engine`; :data:`LAUNCHERS` reads them by key):
the engine's own knowledge (its flags, how it reads a config or a GGUF) lives there; what is known of a method
on an engine comes from the method's record (``MethodSpec.engines``) through :class:`Served`. Adding an engine is
one module here and one test.
"""

from ..registry import LAUNCHERS  # noqa: F401
from .base import COMPUTES, Launch, Served  # noqa: F401

# each module registers its engine when imported, in this order (serve-config's and the card's)
# isort: off
from . import vllm, llama_cpp, sglang, ollama, tgi  # noqa: E402,F401
# isort: on
