"""The two kinds of failure npubuild reports, and how each is worded.

`UserError` (exit 2) is bad input: a recipe, a model file, calibration data. It names the
file, line, column and the dotted field path, and says what to do.
`BuildError` (exit 1) is a stage or a check that failed on valid input: it names the stage,
the tensor and the numbers. The library raises these; only `cli.py` prints and exits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where in a file a problem is: line and column are 1-based."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


MAX_MESSAGE = 4000  # a message quoting hostile input (a 1 MB string) stays readable


class NpubuildError(Exception):
    """Base of every error npubuild reports as one message instead of a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, location: Location | None = None,
                 field: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.field = field
        self.hint = hint

    def __str__(self) -> str:
        head = "".join(
            [f"{self.location}: " if self.location else "",
             f"{self.field}: " if self.field else "",
             self.message])
        if len(head) > MAX_MESSAGE:
            head = f"{head[:MAX_MESSAGE]}… ({len(head) - MAX_MESSAGE:,} more characters)"
        return head + (f"\n  hint: {self.hint}" if self.hint else "")


class UserError(NpubuildError):
    """Bad recipe or bad input (exit code 2)."""

    exit_code = 2


class BuildError(NpubuildError):
    """A stage or one of its numerical checks failed (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, *, stage: str | None = None, **kwargs):
        super().__init__(f"{stage}: {message}" if stage else message, **kwargs)
        self.stage = stage


def machine_error(exc: OSError, stage: str | None = None) -> BuildError:
    """An OSError of the machine (a full disk, a read-only build directory) as the one message
    the user reads, with what to do; the OSError stays its cause (shown with -v)."""
    err = BuildError(f"cannot write or read {exc.filename or 'a file'}: {exc.strerror or exc}",
                     stage=stage, hint="free disk space or build elsewhere (--build-dir, --cache)")
    err.__cause__ = exc
    return err


class BuildLocked(UserError):
    """Another npubuild run holds the build directory's lock."""
