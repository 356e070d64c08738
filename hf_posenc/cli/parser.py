"""The argument parser of every ``hf-posenc`` command: no abbreviated flags (``--token`` is never taken for
``--tokenizer``), and no secret in its errors: an unrecognised argument is named by its flag alone (``unrecognized
arguments: --hub-token ***``), and a word that followed an unknown or secret-named flag is never quoted back
(``eval --token SECRET`` made argparse say ``invalid choice: 'SECRET'``)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

from ..io.provenance import MASK, scrub, secret_name

_NUMBER = r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?"
NEGATIVE_NUMBER = re.compile(rf"^-{_NUMBER}(,-?{_NUMBER})*$")  # -1e-4, and a list that starts with one: -3,5


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help ends with its default, except where there is none to show (None: the flag's help says
    what not giving it means)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``allow_abbrev=False`` always (sub-commands are built of this class too)
    and errors scrubbed of secrets."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._words: list[str] = []
        # a negative number in exponent form, or a list of numbers starting with one, is a value too:
        # "--learning-rate -1e-4" and "--lengths -3,5" reach the flag's own check ("must be > 0, got -0.0001")
        # instead of argparse's "expected one argument"
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(hide_values(extras))}")
        return parsed

    def error(self, message: str) -> NoReturn:
        for word in self._hidden():
            message = message.replace(repr(word), f"'{MASK}'")
        usage = self.format_usage()
        if usage.count("\n") > 3:  # a command of many flags: one line, not a screen above the error
            usage = f"usage: {self.prog} [options] (every option: {self.prog} --help)\n"
        self._print_message(usage, sys.stderr)
        self.exit(2, f"{self.prog}: error: {scrub(message)}\n")

    def _hidden(self) -> list[str]:
        """The words this parser must not quote back: each one after a flag it does not know or whose name says
        secret (argparse may have taken it for a positional), and the value in ``--flag=value`` of such a flag."""
        hidden = []
        for before, word in zip([""] + self._words, self._words):
            flag, eq, value = word.partition("=")
            if eq and flag.startswith("-") and self._suspect(flag):
                hidden.append(value)
            elif before.startswith("-") and "=" not in before and self._suspect(before):
                hidden.append(word)
            elif _keyword_secret(word):  # --engine-arg 'hf_token:SECRET', a mistyped KEY=VALUE
                hidden.append(word)
        return sorted(set(hidden) - {""}, key=len, reverse=True)

    def _suspect(self, flag: str) -> bool:
        return flag not in self._option_string_actions or secret_name(flag)


_KEYWORD = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*[:=\s]")


def _keyword_secret(word: str) -> bool:
    """Whether ``word`` opens with a keyword whose name says secret (``hf_token=``, ``api_key:``)."""
    lead = _KEYWORD.match(word)
    return bool(lead) and secret_name(lead[1], flag=False)


def hide_values(words: list[str]) -> list[str]:
    """Unrecognised arguments as they may be shown: each flag by its name, every value as ``***``."""
    shown = []
    for word in words:
        flag, eq, _ = word.partition("=")
        shown.append(MASK if not word.startswith("-") else f"{flag}={MASK}" if eq else word)
    return shown
