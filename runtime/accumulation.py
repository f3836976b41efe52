"""Gradient accumulation state: which micro-steps synchronise gradients and step the optimizer.

One ``GradientState`` belongs to one ``Accelerator`` and is shared (by reference, no globals) with
the optimizers and schedulers it prepares. ``Accelerator.accumulate`` calls ``advance`` once per
micro-step; the prepared optimizer's ``step``/``zero_grad`` and the prepared scheduler's ``step``
read ``sync_gradients`` (one attribute read, nothing else) and do nothing while it is False.

Rule (Accelerate's): micro-step ``k`` (1-based, counted since the start or since the last end of a
loader) synchronises when ``k % num_steps == 0``, and the last batch of a prepared loader always
synchronises (then the count restarts), so an epoch whose length is not a multiple of
``num_steps`` still ends with an optimizer step.
"""

from __future__ import annotations

from .errors import AccelError


class GradientState:
    """``num_steps`` (gradient_accumulation_steps), the micro-step count and ``sync_gradients``."""

    __slots__ = ("num_steps", "step", "sync_gradients")

    def __init__(self, num_steps: int = 1) -> None:
        self.num_steps = check_accumulation_steps(num_steps)
        self.step = 0
        self.sync_gradients = True

    def advance(self, end_of_dataloader: bool) -> bool:
        """Count one micro-step and return whether it synchronises gradients."""
        if end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % self.num_steps == 0
        return self.sync_gradients


def check_accumulation_steps(value: object) -> int:
    """``value`` as a positive int, or an error that says what was expected."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AccelError(
            f"gradient_accumulation_steps={value!r} is not a positive integer.",
            "gradient_accumulation_steps >= 1 (1 means no accumulation).",
            "pass the number of micro-batches to accumulate per optimizer step, e.g. 4.",
        )
    return value
