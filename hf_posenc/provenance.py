"""What every saved result records about how it was made -- the command and the versions -- with every secret
taken out: the ``token`` argument, ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``, the tokens stored by
``hf auth login``, anything shaped like a Hub token, and the value after a ``--token``-like flag."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from typing import Any

MASK = "***"
_TOKEN_SHAPE = re.compile(r"\b(?:hf_|api_org_)[A-Za-z0-9]{20,}\b")
# --token and its prefixes (--tok, --toke: what an abbreviating parser would take for it), not --tokenizer
_SECRET_FLAG = re.compile(r"(--(?:hf[-_])?tok(?:en?)?|--api[-_]key|--password|--secret)(=|\s+)('[^']*'|\"[^\"]*\"|\S+)")


def known_secrets(*extra: str | None) -> set[str]:
    """The tokens in play: ``extra``, the environment's, and those ``hf auth login`` stored."""
    found = {s for s in extra if s}
    found |= {os.environ.get(k) for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") if os.environ.get(k)}
    try:  # the login's token file (get_token() would prefer the environment's) and every named stored token
        from huggingface_hub import constants
        from huggingface_hub.utils import get_stored_tokens

        if os.path.isfile(constants.HF_TOKEN_PATH):
            with open(constants.HF_TOKEN_PATH, encoding="utf-8") as f:
                found.add(f.read().strip())
        found |= {t for t in get_stored_tokens().values() if t}
    except Exception:  # an unreadable token store holds nothing we could leak from it
        pass
    return {s for s in found if len(s) >= 4}


def scrub(text: str, *extra: str | None) -> str:
    """``text`` with every secret replaced by ``***``."""
    return _scrub_known(text, _longest_first(known_secrets(*extra)))


def _longest_first(secrets: set[str]) -> list[str]:
    return sorted(secrets, key=len, reverse=True)


def _scrub_known(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _TOKEN_SHAPE.sub(MASK, text)


def scrub_data(data: Any, *extra: str | None) -> Any:
    """``data`` (JSON-like) with every string scrubbed (the secrets are gathered once)."""
    secrets = _longest_first(known_secrets(*extra))

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return _scrub_known(item, secrets)
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        return item

    return walk(data)


def recorded_command(command: str | None = None) -> str:
    """The command to record: ``command`` (a caller's own, exact one) scrubbed, else this process's."""
    return scrub(command) if command else command_line()


def command_line(argv: list[str] | None = None, program: str | None = None) -> str:
    """The command line (default: this process's), for the record, scrubbed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    program = program or os.path.basename(sys.argv[0])
    return scrub(shlex.join([program, *argv]))


def environment() -> dict[str, str]:
    import torch
    import transformers

    from ._version import __version__

    return {"hf_posenc": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}
