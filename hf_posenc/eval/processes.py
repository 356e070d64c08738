"""The processes of one evaluation: one, or several started by ``accelerate launch --multi_gpu`` or
``torchrun --nproc_per_node N`` (on CPU too: the processes then meet over gloo).

With several, each computes its share of the cells (``share``), and every process receives every result
(``gather``, accelerate's ``gather_object``); only the main process writes reports. A single process
needs no accelerate state at all.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

T = TypeVar("T")


def device_name(device: str) -> str:
    """What ``device`` is, for the record: ``cpu``, or a GPU with its name (``cuda (NVIDIA H100 80GB HBM3)``)."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
    return device.split(":")[0]


class Processes:
    """``device``: what the run asked for; ``cpu`` joins the processes over gloo (accelerate's MULTI_CPU)."""

    def __init__(self, device: str = "cpu") -> None:
        self.state = None
        self.rank, self.world = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            self.state = PartialState(cpu=device.startswith("cpu"))
            self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, asked: str) -> str:
        """The device this process runs on: ``asked``, or with several processes on an accelerator, the
        process's own one (``cuda`` -> ``cuda:<local rank>``)."""
        if self.state is None or asked == "cpu" or ":" in asked:
            return asked
        return str(self.state.device)

    def share(self, items: list[T]) -> list[T]:
        """This process's items: every ``world``-th, so that each item is computed by exactly one process."""
        return items[self.rank :: self.world]

    def gather(self, items: list[Any]) -> list[Any]:
        """Every process's ``items``, concatenated in rank order, on every process."""
        if self.state is None:
            return list(items)
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def barrier(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()
