"""hf_posenc: change and extend the positional encoding of pretrained Hugging Face models.

    import hf_posenc
    model = hf_posenc.patch(model, "yarn", factor=4.0)
    hf_posenc.get_config(model); hf_posenc.unpatch(model)
    model = hf_posenc.from_pretrained("path", posenc={"method": "pi", "factor": 2.0})
    hf_posenc.save_pretrained(model, "out", tokenizer)          # + model card
    hf_posenc.push_to_hub(model, "user/name", tokenizer)        # save, then upload
    report = hf_posenc.tune(model, tokenizer, target_length=16384)  # which method and knobs
    report = hf_posenc.run_perplexity(model="smollm2-135m", methods=["none", "yarn"], factor=2.0, lengths=[12288])
    hf_posenc.finetune(model, tokenizer, dataset, "out", ...)   # past the original context
    hf_posenc.explain("yarn:factor=4", "pictures/", model="smollm2-135m")  # what it does to positions

The packages are the layers, bottom first: ``encodings`` (pure math), ``methods`` (one record per method), ``config``,
``adapters`` and ``patching`` (per-instance patches), ``checkpoints`` (sources and loading), ``engines`` and
``serving``, ``eval``, ``tuning``, ``explaining``, ``training``, ``publishing``, ``cli``; ``io`` under them all.
"""

import sys
import types

from ._moved import install as _install_moved
from ._version import __version__
from .checkpoints.loading import from_pretrained
from .config import PosEncConfig
from .eval.run_ppl import run_perplexity
from .explaining import explain
from .method_listing import list_methods
from .patching import get_config, is_patched, patch, unpatch
from .publishing.hub import push_to_hub, save_pretrained
from .publishing.patch_job import PatchJob, patch_and_save
from .training.finetune import finetune
from .tuning import tune

__all__ = [
    "PatchJob",
    "PosEncConfig",
    "__version__",
    "explain",
    "finetune",
    "from_pretrained",
    "get_config",
    "is_patched",
    "list_methods",
    "patch",
    "patch_and_save",
    "push_to_hub",
    "run_perplexity",
    "save_pretrained",
    "tune",
    "unpatch",
]


class _Package(types.ModuleType):
    """The package keeps its public functions: importing a moved module by an old name that is also a function here
    (``hf_posenc.finetune``) does not replace the function with the module."""

    def __setattr__(self, name, value):
        if name in __all__ and isinstance(value, types.ModuleType) and name in vars(self):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
_install_moved()  # the old names of moved modules keep importing (hf_posenc._moved.MOVED)
