"""Modules that moved keep importing by their old names, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from hf_posenc._moved import MOVED

# One fresh Python imports every old name in turn, each for the first time there (checked: not yet in sys.modules),
# and reports, per name, the DeprecationWarning its import raised and what star imports and assignments through it
# reach; the tests below read their own name's entry (one interpreter instead of one per name and check: ~5 s each).
FRESH_CHECKS = """
import importlib, json, sys, warnings
out = {}
for old, new_name in json.loads(sys.argv[1]).items():
    entry = out[old] = {"fresh": old not in sys.modules}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            importlib.import_module(old)
        except DeprecationWarning as w:
            entry["warned"] = str(w)
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            new = importlib.import_module(new_name)
            before, after = {}, {}
            exec(f"from {new_name} import *", before)
            exec(f"from {old} import *", after)
            names = sorted(n for n in before if not n.startswith("__"))
            entry["star"] = names == sorted(n for n in after if not n.startswith("__")) and all(
                after[n] is before[n] for n in names)
            entry["names"] = len(names)
            view = importlib.import_module(old)
            view.set_through_the_old_name = 42
            entry["assigned"] = getattr(new, "set_through_the_old_name", None) == 42
            del view.set_through_the_old_name
            entry["deleted"] = not hasattr(new, "set_through_the_old_name")
        except Exception as err:
            entry["error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh() -> dict:
    """Per old name, what a fresh Python saw importing it (:data:`FRESH_CHECKS`)."""
    done = subprocess.run([sys.executable, "-c", FRESH_CHECKS, json.dumps(MOVED)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_a_view_of_the_new_module(old, fresh):
    new = importlib.import_module(MOVED[old])
    assert fresh[old]["fresh"], old  # imported for the first time in that Python: its own warning, not a cached one
    assert f"{old} moved to {MOVED[old]}" in fresh[old].get("warned", "")  # warned, naming where it went
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        sys.modules.pop(old, None)
        view = importlib.import_module(old)
    public = [n for n in dir(new) if not n.startswith("_")]
    assert public and all(getattr(view, n) is getattr(new, n) for n in public)  # the same objects, not copies
    with pytest.raises(AttributeError):
        _ = view.no_such_name_here


def assert_runs(code: str) -> None:
    """``code`` run by a fresh Python (old names not warned: the other tests check the warnings) prints ``ok``."""
    quiet = "import warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
    done = subprocess.run([sys.executable, "-c", quiet + code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_old_import_forms_users_wrote():
    code = ("from hf_posenc.publish import PatchJob, patch_and_save\n"
            "from hf_posenc.eval.data import read_text_file\n"
            "from hf_posenc.eval import report\n"
            "import hf_posenc, hf_posenc.patch_job, hf_posenc.io.documents, hf_posenc.io.reports\n"
            "assert PatchJob is hf_posenc.patch_job.PatchJob is hf_posenc.PatchJob\n"
            "assert read_text_file is hf_posenc.io.documents.read_text_file\n"
            "assert report.markdown_table is hf_posenc.io.reports.markdown_table\n"
            "print('ok')\n")
    assert_runs(code)


def test_the_modules_that_became_packages_and_functions_keep_their_old_forms():
    """``hf_posenc.serving`` was a module (now the package, its names in ``.support``); ``hf_posenc.finetune`` was a
    module (now the public function): the old imports still work, and importing the old module path does not turn
    the function back into a module."""
    code = ("import hf_posenc\n"
            "from hf_posenc.serving import known_status\n"
            "from hf_posenc.serving.support import known_status as moved\n"
            "assert known_status is moved\n"
            "import hf_posenc.finetune\n"
            "from hf_posenc.finetune import PoseSettings, finetune\n"
            "from hf_posenc.training.finetune import finetune as new\n"
            "assert finetune is new and hf_posenc.finetune is new and callable(hf_posenc.finetune)\n"
            "from hf_posenc.loading import from_pretrained\n"
            "assert from_pretrained is hf_posenc.from_pretrained\n"
            "print('ok')\n")
    assert_runs(code)
    with pytest.warns(DeprecationWarning, match=r"hf_posenc\.serving\.support\.known_status"):
        import hf_posenc.serving as serving

        assert callable(serving.known_status)
    with pytest.raises(AttributeError):
        assert serving.no_such_name_here


def test_a_name_that_never_existed_is_still_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hf_posenc.eval.no_such_module")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_star_import_and_assignment_through_an_old_name_reach_the_new_module(old, fresh):
    entry = fresh[old]
    assert "error" not in entry, entry.get("error")
    assert entry["names"] > 0 and entry["star"], entry  # the same public names, the very same objects
    assert entry["assigned"] and entry["deleted"], entry  # set and deleted on the new module through the old name
