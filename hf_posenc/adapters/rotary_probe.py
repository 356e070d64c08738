"""Whether a rotary module computes its cos/sin from its frequency buffers: hf_posenc changes RoPE by writing them,
which changes nothing in a module that recomputes its frequencies from the config at every forward (PhiMoE's)."""

from __future__ import annotations

from typing import Any

import torch

from .layout import RotarySlot
from .rotary_layout import rotary_output


def reads_frequencies(slot: RotarySlot) -> bool | None:
    """True where the slot's forward follows its ``*inv_freq`` buffers (run at four positions, then with the buffers
    doubled; they are put back), False where it does not, None where the forward cannot be run so (another
    signature, weights not loaded): the probe has no answer then."""
    m = slot.module
    prefix = "" if slot.layer_type is None else f"{slot.layer_type}_"
    names = [n for n, b in m.named_buffers(recurse=False) if n.startswith(prefix) and n.endswith("inv_freq")
             and b is not None and b.device.type != "meta"]
    if not names:
        return None
    saved = {n: getattr(m, n) for n in names}
    x = torch.zeros(1, 1, device=saved[names[0]].device)
    positions = torch.arange(1, 5, device=x.device)[None]
    try:
        with torch.no_grad():
            before = rotary_output(slot, x, positions)[1]
            for n in names:
                setattr(m, n, saved[n] * 2)
            after = rotary_output(slot, x, positions)[1]
    except Exception:  # noqa: BLE001 (a module of another signature: no answer, not a refusal)
        return None
    finally:
        for n in names:
            setattr(m, n, saved[n])
    return not torch.equal(before, after)


def check_reads_frequencies(slots: list[RotarySlot], config: Any, name: str) -> None:
    """Refuses, by name, a method that writes the frequencies of a rotary module which does not read them."""
    for s in slots:
        if reads_frequencies(s) is False:
            raise ValueError(f"{name} writes the rotary frequencies of {type(s.module).__name__}, but that module "
                             f"computes its cos/sin from the config at every forward, not from its inv_freq buffer: "
                             f"the patch would change nothing on model_type={config.model_type!r}, which hf_posenc "
                             "does not support yet.")
