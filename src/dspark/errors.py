"""Errors a user can cause. The CLI prints them as one line, never as a traceback."""


class DsparkError(Exception):
    """Base class of every error that is the user's to fix (bad path, bad number, ...)."""


class PromptTooLongError(DsparkError):
    """The prompt (plus at least one new token) does not fit in the target's context."""


class UnsupportedTargetError(DsparkError):
    """A target family a component cannot run (yet), named with what to use instead."""


class InvalidSamplingError(DsparkError, ValueError):
    """Sampling parameters out of range (a ValueError too, for library callers)."""
