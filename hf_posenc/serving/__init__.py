"""What engines compute for a saved checkpoint: the known support rows (:mod:`.support`), serve-check
(:mod:`.check`), serve-config (:mod:`.launch_settings`), GGUF writing (:mod:`.gguf_file`), freezing
(:mod:`.freezing`) and SGLang's dual-chunk config (:mod:`.dual_chunk_config`)."""

import importlib
import warnings


def __getattr__(name: str):
    """The names of the former module ``hf_posenc.serving``, now :mod:`hf_posenc.serving.support`."""
    support = importlib.import_module(f"{__name__}.support")
    if name.startswith("__") or not hasattr(support, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"hf_posenc.serving.{name} moved to hf_posenc.serving.support.{name}; import it from there",
                  DeprecationWarning, stacklevel=2)
    return getattr(support, name)
