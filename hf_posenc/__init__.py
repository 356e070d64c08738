"""hf_posenc: change and extend the positional encoding of pretrained Hugging Face models.

    import hf_posenc
    model = hf_posenc.patch(model, "yarn", factor=4.0)
    hf_posenc.get_config(model); hf_posenc.unpatch(model)
    model = hf_posenc.from_pretrained("path", posenc={"method": "pi", "factor": 2.0})
    hf_posenc.save_pretrained(model, "out", tokenizer)          # + model card
    hf_posenc.push_to_hub(model, "user/name", tokenizer)        # save, then upload
    report = hf_posenc.tune(model, tokenizer, target_length=16384)  # which method and knobs
    hf_posenc.explain("yarn:factor=4", "pictures/", model="smollm2-135m")  # what it does to positions
"""

from ._moved import install as _install_moved
from ._version import __version__
from .config import PosEncConfig
from .explaining import explain
from .hub import push_to_hub, save_pretrained
from .loading import from_pretrained
from .patching import get_config, is_patched, patch, unpatch
from .method_listing import list_methods
from .patch_job import PatchJob, patch_and_save
from .tuning import tune

_install_moved()  # the old names of moved modules keep importing (hf_posenc._moved.MOVED)

__all__ = [
    "PatchJob",
    "PosEncConfig",
    "__version__",
    "explain",
    "from_pretrained",
    "get_config",
    "is_patched",
    "list_methods",
    "patch",
    "patch_and_save",
    "push_to_hub",
    "save_pretrained",
    "tune",
    "unpatch",
]
