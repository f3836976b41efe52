"""Runtime errors whose messages say what happened, what was expected, and the fix."""

from __future__ import annotations


def format_message(happened: str, expected: str, fix: str) -> str:
    """Build the three-part message every runtime error uses."""
    return f"{happened}\n  expected: {expected}\n  fix: {fix}"


class AccelError(RuntimeError):
    """Base class of every error the runtime raises on purpose."""

    def __init__(self, happened: str, expected: str, fix: str) -> None:
        super().__init__(format_message(happened, expected, fix))
        self.happened = happened
        self.expected = expected
        self.fix = fix


class UnsupportedOptionError(AccelError, NotImplementedError):
    """An Accelerate option, or a value of it, that this runtime does not implement yet."""

    def __init__(self, option: str, value: object, supported: str, fix: str | None = None) -> None:
        super().__init__(
            happened=f"{option}={value!r} is not supported by this runtime yet.",
            expected=supported,
            fix=fix
            or f"drop {option} (or use a supported value), or run the script under HF Accelerate "
            "until this runtime supports it.",
        )
        self.option = option
        self.value = value


class DistributedEnvironmentError(AccelError):
    """torchrun's environment is incomplete or contradicts an existing process group."""


class PrepareError(AccelError):
    """An object passed to ``Accelerator.prepare`` cannot be prepared."""


class GradientSyncError(AccelError):
    """A prepared model's gradients differ between processes after a synchronising backward."""
