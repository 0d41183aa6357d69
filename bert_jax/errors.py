"""Errors whose message is the whole story for the user.

    raise UserError("configs/x.py: unknown key 'train.stpes' (did you mean 'train.steps'?)")

`launch/` entry points print such an error as one line (no traceback unless --verbose) and
exit with its `exit_code`; anything else is a bug and keeps its traceback. Every error class
of the package that reports a user's mistake or a fault of the run's environment derives
from one of these, beside its own builtin base (ValueError, ...) so existing `except`
clauses keep working.
"""

from __future__ import annotations


class ReportedError(Exception):
    """Base: the message names what, where (file, line, key or value) and what to do."""

    exit_code = 1


class UserError(ReportedError):
    """A mistake in the input the user gave (config, flag, file, checkpoint): exit 2."""

    exit_code = 2


class FaultError(ReportedError):
    """The run's environment failed (disk full, damaged checkpoint, non-finite loss) after
    the run saved what it could: exit 1."""

    exit_code = 1
