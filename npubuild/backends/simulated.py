"""The simulated chips (npu-16m, npu-strict, npu-tiny): npubuild's own compiler (layer groups,
LMEM plan, program) and its bit-exact simulator, ARCHITECTURE §4."""

from __future__ import annotations

from pathlib import Path

from npubuild.backends import SIMULATED, Backend, register


class Simulated(Backend):
    name = SIMULATED
    description = "npubuild's own compiler and bit-exact simulator (no silicon behind it)"
    runs_in = "npubuild's simulator"
    plans_lmem = True

    def compile(self, ctx) -> dict:
        from npubuild.stages.compile import compile_simulated

        return compile_simulated(ctx)

    def npu_runner(self, compile_dir: Path):
        from npubuild.runtime.simulator import simulator_backend

        return simulator_backend(Path(compile_dir).parent)


register(Simulated())
