"""Arm Ethos-U (U55/U65/U85) through Vela: a full-int8 TFLite -> the Vela-compiled TFLite."""

from __future__ import annotations

from npubuild.backends import Backend, register


class Vela(Backend):
    name = "vela"
    description = "Arm Vela: full-int8 TFLite -> Ethos-U command stream, proven on the int8 TFLite"
    toolchain = "vela"
    runs_in = "the TFLite interpreter on the int8 TFLite Vela compiles (Ethos-U matches its reference kernels)"


register(Vela())
