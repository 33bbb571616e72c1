"""Frames per second as a reviewer needs them: the deployment's (NPU cycles plus the CPU parts,
one after the other) and the NPU's alone, both labelled, the latency in ms, and — where the
deployment's cannot be shown — why.

The NPU figures are deterministic (cycles from the compiled program) and travel with the
compile stage's artifacts; the CPU parts are timed with ONNX Runtime on the machine that ran
compile, so they live in report.json only. After a cache restore the CPU part is therefore
unknown — unless there is none, when the deployment is the NPU alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from npubuild.report.judged import is_number

NOT_MEASURED = ("CPU part not measured here: compile was restored from a cache, and its {n} CPU "
                "part{s} ({names}) {verb} timed with ONNX Runtime only where compile runs; "
                "`npubuild run R --force compile` measures them")


@dataclass(frozen=True)
class Speed:
    deployed_fps: float | None  # NPU + CPU parts; None when the CPU parts were not measured here
    npu_fps: float | None
    cpu_seconds: float | None
    npu_seconds: float | None
    cpu_parts: int | None  # None: unknown (compile not built)
    missing: str = ""  # why deployed_fps is None

    @property
    def latency_ms(self) -> float | None:
        return 1000.0 / self.deployed_fps if self.deployed_fps else None

    @property
    def npu_latency_ms(self) -> float | None:
        return 1000.0 / self.npu_fps if self.npu_fps else None


REAL_CHIP_CPU = "a real-chip build times no CPU part"


def vendor_speed(vendor: dict | None, estimate: dict | None) -> list[str]:
    """A real chip's speed figures, each named by whose it is: the NPU part by the vendor's
    own estimate (inferences/s where it gives them, else its cycles) and by npubuild's model of
    the chip; none for a build of a simulated chip (no ``vendor`` section)."""
    if not vendor:
        return []
    figures = []
    if is_number(vendor.get("inferences_per_second")):
        figures.append(f"{fps_text(vendor['inferences_per_second'])} inferences/s "
                       f"({vendor.get('backend')}'s estimate)")
    elif is_number(vendor.get("cycles")) and vendor["cycles"]:
        figures.append(f"{vendor['cycles']:,} cycles ({vendor.get('backend')}'s estimate)")
    npu = speed(estimate).npu_fps
    if npu is not None:
        figures.append(f"{fps_text(npu)} fps (npubuild's model of the chip)")
    return figures


def speed(estimate: dict | None) -> Speed:
    """The fps figures of report.json's (or a compile manifest's) ``estimate``."""
    estimate = estimate or {}
    npu = estimate.get("npu_fps") if is_number(estimate.get("npu_fps")) else None
    npu_seconds = estimate.get("npu_seconds") if is_number(estimate.get("npu_seconds")) else (
        1.0 / npu if npu else None)
    parts = (estimate.get("cpu") or {}).get("parts") if isinstance(estimate.get("cpu"), dict) else None
    count = len(parts) if isinstance(parts, dict) else None
    if is_number(estimate.get("fps")):
        cpu = estimate.get("cpu_seconds") if is_number(estimate.get("cpu_seconds")) else None
        return Speed(estimate["fps"], npu, cpu, npu_seconds, count)
    if count == 0 and npu is not None:  # nothing runs on the CPU: the NPU is the deployment
        return Speed(npu, npu, 0.0, npu_seconds, 0)
    missing = REAL_CHIP_CPU if count is None and npu is not None else ""
    if count:
        names = ", ".join(sorted(parts)[:3]) + (", …" if count > 3 else "")
        missing = NOT_MEASURED.format(n=count, s="s" * (count > 1), names=names,
                                      verb="are" if count > 1 else "is")
    return Speed(None, npu, None, npu_seconds, count, missing)


def fps_text(value: float | None) -> str:
    """4,372 fps above 100, 12.5 below (a slow deployment keeps its decimal)."""
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def ms_text(value: float | None) -> str:
    """Milliseconds to 3 significant digits; below 0.1 ms in µs."""
    if value is None:
        return "—"
    if value < 0.1:
        return f"{value * 1000:.3g} µs"
    return f"{value:.3g} ms" if value < 100 else f"{value:,.0f} ms"
