"""The two kinds of failure npubuild reports, and how each is worded.

`UserError` (exit 2) is bad input: a recipe, a model file, calibration data. It names the
file, line, column and the dotted field path, and says what to do.
`BuildError` (exit 1) is a stage or a check that failed on valid input: it names the stage,
the tensor and the numbers. The library raises these; only `cli.py` prints and exits.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


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


def did_you_mean(name: object, known, n: int = 1) -> str:
    """``; did you mean 'conv_bn'?`` for a misspelt name among ``known`` (difflib's closest,
    up to ``n``), else "": every name a recipe or a command takes says it the same way."""
    import difflib

    close = difflib.get_close_matches(str(name)[:200], sorted(map(str, known)), n=n)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def machine_error(exc: OSError, stage: str | None = None) -> BuildError:
    """An OSError of the machine (a full disk, a read-only build directory) as the one message
    the user reads, with what to do; the OSError stays its cause (shown with -v)."""
    err = BuildError(f"cannot write or read {exc.filename or 'a file'}: {exc.strerror or exc}",
                     stage=stage, hint="free disk space or build elsewhere (--build-dir, --cache)")
    err.__cause__ = exc
    return err


class BuildLocked(UserError):
    """Another npubuild run holds the build directory's lock."""


@contextmanager
def working_on(**place: str | None) -> Iterator[None]:
    """Say what the code inside works on (``graph=``, ``node=``, ``tensor=``, ``sample=``): an
    exception npubuild did not expect carries it out (``npubuild_place``; the innermost place
    first), so the stage's failure names where it happened instead of being a bare traceback."""
    try:
        yield
    except NpubuildError:
        raise
    except Exception as exc:
        known = getattr(exc, "npubuild_place", {})
        exc.npubuild_place = {**known, **{k: v for k, v in place.items()
                                          if v is not None and k not in known}}
        raise


def unexpected(exc: Exception, stage: str) -> BuildError:
    """An exception a stage did not translate, as that stage's failure: where it happened
    (`working_on`), what was raised, and what the user can do about it."""
    place = getattr(exc, "npubuild_place", {})
    order = ("graph", "node", "tensor", "sample")
    where = ", ".join(f"{k} {place[k]!r}" for k in sorted(place, key=lambda k: (
        order.index(k) if k in order else len(order), k)))
    text = str(exc).strip().splitlines()
    message = ("failed" + (f" at {where}" if where else "")
               + f": {type(exc).__name__}: {text[0][:500] if text else ''}".rstrip(": "))
    dodge = (f"to build past it, run node {place['node']!r} on the CPU (split.force_cpu: "
             f"[{place['node']!r}]); " if "node" in place and stage in ("quantize", "compile")
             else "")
    if isinstance(exc, MemoryError):
        err = out_of_memory(exc, stage, where)
    else:
        err = BuildError(message, stage=stage, hint=(
            f"the stages before {stage} built and proved their outputs; {stage} itself failed on "
            f"this model: {dodge}report it with the recipe and model (-v prints the traceback)"))
    err.__cause__ = exc
    return err


# What a stage holds across its samples, for the hint of a stage that ran out of memory.
HELD = {"quantize": "the float and integer values verify judges (model outputs, judged "
                    "hand-over tensors) of every verify sample, and one sample's tensors at a time",
        "verify": "the model outputs of every verify sample and one sample's hand-over "
                  "tensors at a time (a failing verify's hints: those their verdicts read, of "
                  "every sample)"}


def out_of_memory(exc: MemoryError, stage: str, where: str = "") -> BuildError:
    """A stage that ran out of memory, said once: where, what the process had reached (its
    peak resident size), what the stage holds, and what makes it hold less."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin"
                                                                   else 1024)
    text = str(exc).strip().splitlines()
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    cap = "" if limit == resource.RLIM_INFINITY else f", address-space limit {limit / 2**30:.1f} GB"
    held = HELD.get(stage, "what this stage computes")
    return BuildError(
        f"ran out of memory{f' at {where}' if where else ''} (peak resident {peak / 2**30:.1f} "
        f"GB{cap}): {text[0][:300] if text else 'MemoryError'}", stage=stage,
        hint=f"{stage} holds {held}: fewer verify.samples (or calibration samples) hold less; "
             f"or run where more memory is free")
