"""The transformers release hf_posenc is tested with, and a warning when the installed one is newer.

hf_posenc hooks into transformers' model internals (the attention registry, the KV cache and the keyword it is
passed under, the rotary modules); a newer minor release can change them (5.24 renamed ``past_key_values`` to
``cache``). ``scripts/setup.sh`` installs the tested release (``scripts/constraints.txt``); with a newer one,
patching still runs and says so once, so that a user knows which results the test suite stands behind.
"""

from __future__ import annotations

import warnings

TESTED_TRANSFORMERS = "5.24.0"  # the newest transformers release the test suite passed on (scripts/constraints.txt)


def _minor(version: str) -> tuple[int, int]:
    from packaging.version import Version

    release = Version(version).release
    return release[0], release[1] if len(release) > 1 else 0


def installed_transformers() -> str:
    """The installed transformers release."""
    import transformers

    return transformers.__version__


def untested_transformers(installed: str | None = None) -> str | None:
    """A sentence saying that the installed transformers is newer than the tested one, or None."""
    installed = installed if installed is not None else installed_transformers()
    if _minor(installed) <= _minor(TESTED_TRANSFORMERS):
        return None
    return (f"transformers {installed} is newer than the newest release hf_posenc is tested with "
            f"({TESTED_TRANSFORMERS}): patched models may rely on internals it changed. Run hf_posenc's test suite "
            f"against it, or install transformers=={TESTED_TRANSFORMERS}.")


def warn_if_untested() -> None:
    """Warn (once per process, by Python's warning filter) when the installed transformers is untested."""
    message = untested_transformers()
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)
