"""What every saved result records about how it was made -- the command and the versions -- with every secret
taken out: the ``token`` argument, ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``, the tokens stored by
``hf auth login``, anything shaped like a Hub token, a URL's password, and the value after any flag, ``NAME=``
or mapping key whose name says it holds a secret (:func:`secret_name`)."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from typing import Any

from .._version import __version__

MASK = "***"
_TOKEN_SHAPE = re.compile(r"\b(?:hf_|api_org_)[A-Za-z0-9]{20,}\b")
_VALUE = r"""(?:'[^']*'|"[^"]*"|\S)+"""  # a word, quoted parts and all (an unclosed quote: to the next space)
_FLAG = re.compile(rf"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|\s+)(?!-)({_VALUE})")
_ASSIGNED = re.compile(r"""(?<![\w.-])([A-Za-z_][\w.-]*)=((?:'[^']*'|"[^"]*"|[^\s,;)}\]])+)""")
_MAPPED = re.compile(r"""(["'])([A-Za-z_][\w.-]*)\1(\s*:\s*)('[^']*'|"[^"]*"|[^\s,}\]]+)""")
_BEARER = re.compile(r"\b(Bearer)(\s+)([A-Za-z0-9._~+/=-]{8,})")
# a URL's user:password@ whatever became of its slashes (``https://``, ``https:/`` as a path library leaves it, none),
# with or without a scheme, and percent-encoded (``https%3A%2F%2Fuser%3Apassword%40host``)
_URL_PASSWORD = re.compile(r"((?:\b[a-z][\w+.-]*:/*)?(?<![\w.~%+-])[\w.~%+-]*:)([^/\s@'\"]+)@(?=[\w\[])",
                           re.IGNORECASE)
_ENCODED_URL_PASSWORD = re.compile(r"((?:%3A|%2F|[:/])+[\w.~+-]*%3A)((?:(?!%40|%2F)[^/\s@'\"])+)%40", re.IGNORECASE)
_SECRET_WORDS = ("secret", "passw", "passphrase", "credential")


def secret_name(name: str, flag: bool = True) -> bool:
    """Whether the flag or keyword ``name`` holds a secret: its last word ends in ``token`` (``--token``,
    ``--hub_token``, ``--use-auth-token``, ``hubToken``; ``--tok`` as an abbreviation) or ``key`` (``--api-key``,
    ``--key``; not ``passkey``), or a word starts with ``auth`` (not ``author``) or says secret, password,
    passphrase or credential. Not secret: ``--tokenizer``, ``--max-gen-tokens``, ``--key-tokens``, ``--keys``,
    ``--pad-token-id``. A bare ``key`` is secret as a flag only (``flag``): as a keyword it is a passkey's field."""
    words = [w for w in re.split(r"[-_.\s]+", name.lower()) if w]
    if not words or (not flag and words == ["key"]):
        return False
    last = words[-1]
    if last.endswith("token") or last in ("tok", "toke") or (last.endswith("key") and last != "passkey"):
        return True
    return any((w.startswith("auth") and w not in ("author", "authors")) or any(s in w for s in _SECRET_WORDS)
               for w in words)


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
    text = _FLAG.sub(lambda m: f"{m[1]}{m[2]}{MASK}" if secret_name(m[1]) else m[0], text)
    text = _ASSIGNED.sub(lambda m: f"{m[1]}={_quoted_mask(m[2])}" if secret_name(m[1], False) else m[0], text)
    text = _MAPPED.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{_quoted_mask(m[4])}" if secret_name(m[2], False)
                       else m[0], text)
    text = _BEARER.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m[1]}{MASK}@", text)
    text = _ENCODED_URL_PASSWORD.sub(lambda m: f"{m[1]}{MASK}%40", text)
    return _TOKEN_SHAPE.sub(MASK, text)


def _quoted_mask(value: str) -> str:
    """``***``, in the quotes ``value`` stood in (a repr or JSON stays one)."""
    quote = value[0] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else ""
    return f"{quote}{MASK}{quote}"


def scrub_data(data: Any, *extra: str | None) -> Any:
    """``data`` (JSON-like) with every string scrubbed (the secrets are gathered once)."""
    secrets = _longest_first(known_secrets(*extra))

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return _scrub_known(item, secrets)
        if isinstance(item, dict):
            return {k: MASK if _secret_field(k, v) else walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        return item

    return walk(data)


def _secret_field(key: Any, value: Any) -> bool:
    """A mapping's entry that holds a secret: a text or number under a secret name (``hf_token``, ``api_key``)."""
    return (isinstance(key, str) and isinstance(value, (str, int, float)) and not isinstance(value, bool)
            and secret_name(key, flag=False))


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

    return {"hf_posenc": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}
