"""What a method's check computed on a model, held for the apply that follows it: probes that run the model's
layers (which layers rotate, the attention-level plan) then run once per patch."""

from __future__ import annotations

import weakref
from typing import Any, Callable

from torch import nn

from .layout import layer_modules


class HeldChecks:
    """Per model (weakly), one value a check computed under ``key``, given back once to the apply that asks with the
    same key while the model's attention modules are the same objects; else computed again."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def hold(self, model: nn.Module, key: Any, value: Any) -> None:
        self._held[model] = (key, layer_modules(model), value)

    def take(self, model: nn.Module, key: Any, compute: Callable[[], Any]) -> Any:
        held = self._held.pop(model, None)
        if held is not None and held[0] == key and held[1] == layer_modules(model):  # (modules by identity)
            return held[2]
        return compute()
