"""Serving engines: one record per engine (:mod:`.registry`), each registered by its module under :mod:`.launch`
(serve-config's launch settings); those hf_posenc runs here sit behind one scoring interface (:mod:`.scorer`): vLLM
(:mod:`.vllm_engine`, an engine process) and llama.cpp (:mod:`.llama_cpp_engine`, through llama-cpp-python). What
each computes as hf_posenc does is said by the method records (``MethodSpec.engines``)."""

from . import launch  # noqa: F401  (registers every engine)
from .registry import ENGINES as REGISTRY  # noqa: F401
from .registry import display_name, engine, register_engine, runnable, unregister_engine  # noqa: F401  (re-exported)
from .settings import EngineSettings  # noqa: F401


def __getattr__(name: str):
    """``ENGINES`` (the engines serve-check starts) and ``ENGINE_NAMES`` (each as records and cards name it), read
    from the registry when asked, so an engine registered later is among them."""
    if name == "ENGINES":
        return runnable()
    if name == "ENGINE_NAMES":
        return {key: display_name(key) for key in REGISTRY}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
