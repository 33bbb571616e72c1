"""The target chip: a validated data file (ARCHITECTURE §3).

Code reads ``chip.lmem_bytes_per_lane``, never a chip's name. Built-in presets ship as YAML in
this package; a recipe may name its own chip file. ``schemas/chip.schema.json`` is generated
from ``Chip``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    # A docstring under a field is its description in the JSON Schema (what editors show), read
    # when the schema is generated (`npubuild.schemas.docstrings`).
    model_config = ConfigDict(extra="forbid")


class OpSupport(Strict):
    """Constraints under which one ONNX op (or fused function) runs on the NPU.

    Unset fields impose nothing. The split stage checks each against the node's attributes
    and inferred shapes; every failed check gives the user its reason text.
    """

    ranks: list[int] | None = Field(None, description="Allowed ranks of every input and output.")
    dtypes: list[str] | None = Field(None, description="Allowed float dtypes before quantization.")
    max_kernel: int | None = Field(None, ge=1, description="Max size of each kernel dimension.")
    kernel_sizes: list[int] | None = Field(
        None, description="Allowed sizes of each kernel dimension (a small kernel set).")
    max_stride: int | None = Field(None, ge=1)
    """Max stride along each axis."""
    max_dilation: int | None = Field(None, ge=1)
    """Max dilation along each axis."""
    max_pad: int | None = Field(None, ge=0)
    """Max padding on each side."""
    groups: Literal["any", "one", "depthwise", "one_or_depthwise"] = "any"
    """Allowed convolution groups: any, one (dense), depthwise, or either of those two."""
    max_channels: int | None = Field(
        None, ge=1, description="Conv: the most input channels one output channel reads, and "
                                "the most output channels one NPU step computes (the compiler "
                                "splits a wider layer into output-channel slices); ConvTranspose: "
                                "max input and output channels.")
    axes: list[int] | None = Field(None, description="Allowed axes (Concat, Split, Softmax), "
                                                    "normalised to non-negative for 4-D.")
    resize_modes: list[str] | None = None
    """Allowed Resize modes (nearest, linear, ...)."""
    resize_integer_scales: bool = False
    """Resize only by whole-number scales."""
    resize_coordinate_modes: list[str] | None = Field(
        None, description="Allowed Resize coordinate_transformation_mode values.")
    pad_modes: list[str] | None = Field(None, description="Allowed Pad modes.")
    same_padding_only: bool = False
    """AveragePool: padding left out of the average (count_include_pad 0) only as TFLite's SAME pads it."""
    broadcast: Literal["any", "same_shape", "channel", "scalar_or_channel"] = "any"
    """How the inputs of an elementwise op may differ in shape: any broadcast, same shape, per channel, or scalar or per channel."""
    vendor_kernel: Literal["int8", "float16"] | None = Field(None, description=(
        "Where npubuild's quantizer has no integer kernel for a node of this op whose inputs "
        "are all activations (a MatMul of two), the vendor's toolchain runs it on the NPU all "
        "the same, from the "
        "QDQ model it is handed: int8 (its own kernel reads the int8 inputs and writes the "
        "int8 output the Q/DQ around the node give; npubuild keeps the node as a float op "
        "between integer tensors, which computes the same up to rounding) or float16 (a float "
        "layer, its output kept in float, as `fc_integer_ranks` keeps a fully connected "
        "layer). Unset: such a node runs on the CPU."))
    note: str | None = Field(None, description="Free text shown in SUPPORTED_OPS.md.")


class MacArray(Strict):
    """How the MAC array computes each op, for the estimate: its utilisation (which shapes
    waste it) and its output rate. The rules are Arm Vela's performance model for Ethos-U; the
    numbers are the chip's. Without it the estimate counts MACs ÷ (lanes × MACs per lane)."""

    microblock: list[int] = Field(min_length=3, max_length=3, description=(
        "[h, w, c]: output elements computed together; an op's output is rounded up to whole "
        "microblocks (Ethos-U55-256: [2, 2, 8])."))
    ifm_depth_per_step: int = Field(32, ge=1, description=(
        "Input channels one step of a dense conv reads (a conv's input depth is rounded up to "
        "it)."))
    cycles_per_step: int = Field(4, ge=1, description=(
        "Cycles of one step: one kernel element (or a few, below) over one input-depth chunk "
        "for every microblock of the block."))
    min_cycles_per_step: int = Field(32, ge=0, description=(
        "A step never takes fewer cycles (accumulator write-back), which makes small outputs "
        "— a fully connected layer, a 3x3 feature map — slow per MAC."))
    kernel_elements_per_step: int = Field(4, ge=1, description=(
        "Kernel elements one step covers in a depthwise conv, and in a dense conv computed "
        "'part-kernel first' (chosen when it uses the array better: few input channels)."))
    part_kernel_depth: int = Field(16, ge=1, description=(
        "Input channels per step of a part-kernel-first dense conv."))
    output_cycles_per_element: dict[str, float] = Field(default_factory=dict, description=(
        "Cycles per output element by op (conv, depthwise, pool, maxpool, add, mul, lut, "
        "default): the output stage's rate, which bounds element-wise ops and small convs."))
    activation_cycles_per_element: dict[str, float] = Field(default_factory=dict, description=(
        "Cycles per output element of a fused activation (lut: a lookup table)."))
    block_max: list[int] = Field([32, 64, 128], min_length=3, max_length=3, description=(
        "[h, w, c]: the largest output block one command computes (Ethos-U: [32, 64, 128])."))
    elementwise_block_bytes: int | None = Field(None, ge=1, description=(
        "Bytes of the shared buffer one input block of an element-wise op may take (Ethos-U55-256: "
        "48 banks of 1 KiB, less 4 reserved, halved for two inputs, double-buffered, in granules "
        "of 8 banks: 8192); it bounds the op's block, whose depth sets how much of each burst a "
        "constant operand uses (see weights_burst_bytes). None: not modelled."))

    @property
    def peak_macs_per_cycle(self) -> float:
        h, w, c = self.microblock
        return h * w * c * self.ifm_depth_per_step / self.cycles_per_step


class Chip(Strict):
    """An NPU: memory, compute, bandwidth, the op table and the backend that builds for it."""

    name: str
    """The chip's name (`target:` in a recipe)."""
    description: str = ""
    """One line shown by `npubuild targets`."""
    modelled_on: str = Field("", description="Public datasheet figures this preset borrows.")
    backend: str = Field("simulated", description=(
        "How npubuild builds for this chip (`npubuild.backends`): simulated (npubuild's own "
        "compiler and simulator), or a vendor toolchain such as rknn, tpu-mlir or vela."))
    vendor: str = Field("", description="Who makes the chip (real chips).")
    platform: str = Field("", description=(
        "The chip's name in its vendor toolchain (RKNN target_platform, TPU-MLIR --chip, "
        "Vela --accelerator-config); empty for simulated chips."))
    support_source: str = Field("", description=(
        "Where the op table comes from (the vendor's own support list, with its version)."))
    lanes: int = Field(ge=1, description="Parallel lanes (NPUs); LMEM is split among them.")
    lmem_bytes_per_lane: int = Field(ge=1024)
    """Local memory (LMEM) per lane, in bytes."""
    lmem_banks: int = Field(ge=1, description="Banks per lane; buffers avoid crossing them.")
    gmem_bytes: int = Field(ge=1)
    """Global memory (GMEM, DRAM) size in bytes."""
    gmem_bandwidth_bytes_per_cycle: float = Field(gt=0)
    """Bytes moved between GMEM and LMEM per clock cycle."""
    clock_mhz: float = Field(gt=0)
    """Clock frequency in MHz (for cycles to seconds)."""
    macs_per_cycle_per_lane: int = Field(ge=1, description="int8 MACs per cycle per lane.")
    float_macs_per_cycle_per_lane: int | None = Field(None, ge=1, description=(
        "Float16 MACs per cycle per lane, where the NPU itself runs the layers quantization "
        "keeps in float (RKNN and TPU-MLIR take them as float16); none: they run on the host "
        "CPU. The precision search prices a float choice with it."))
    mac_array: MacArray | None = Field(None, description=(
        "The MAC array's utilisation rules for the estimate (none: every MAC at peak)."))
    lmem_bandwidth_bytes_per_cycle: float | None = Field(None, gt=0, description=(
        "Bytes per cycle between LMEM and the MAC array (the fast port): a compute step takes "
        "at least its operands' and results' bytes over this (none: free)."))
    weights_bandwidth_bytes_per_cycle: float | None = Field(None, gt=0, description=(
        "Weights stream from their own memory (e.g. flash) through this port, in parallel "
        "with GMEM (none: weights are in GMEM, on its bandwidth)."))
    weights_burst_bytes: int | None = Field(None, ge=1, description=(
        "Bytes one burst of the memory holding the weights and constants moves: a read of fewer "
        "contiguous bytes costs a whole burst (Vela's OffChipFlash_burst_length and "
        "Dram_burst_length: 128). None: every byte read is useful."))
    weights_off_chip: bool = Field(True, description=(
        "Whether the weights' memory is off-chip (counted in the estimate's off-chip bytes)."))
    gmem_off_chip: bool = Field(True, description=(
        "Whether GMEM is off-chip (an on-chip SRAM arena is not: its traffic is not counted in "
        "the estimate's off-chip bytes)."))
    int16: bool = Field(False, description="Whether int16 activations are supported.")
    int16_mac_rate: float = Field(0.5, gt=0, le=1, description=(
        "MACs per cycle with int16 activations and int8 weights, as a fraction of the int8 "
        "rate (the `int16` precision). Default 0.5: Arm's Ethos-U and Rockchip's NPUs run a "
        "16-bit input at half the 8-bit rate (Vela's performance model halves the input depth "
        "per step, the kernel elements per part-kernel step, and doubles depthwise and pool "
        "cycles)."))
    w16a16_mac_rate: float = Field(0.25, gt=0, le=1, description=(
        "MACs per cycle with int16 activations and int16 weights (the `w16a16` precision), as "
        "a fraction of the int8 rate. Default 0.25: four 8x8 partial products per MAC, for a "
        "chip whose datasheet gives no 16x16 figure."))
    fc_integer_ranks: list[int] | None = Field(None, description=(
        "Input ranks at which the vendor takes a fully connected layer (Gemm, MatMul by a "
        "constant) from npubuild's quantization in int8; at another rank quantize keeps the "
        "layer in float, and a fully connected layer kept in float keeps its output in float "
        "(the vendor runs it in float16). None: any rank, and no such rule."))
    float_fallback: bool = Field(True, description=(
        "Whether the host may run in float what int8 (or int16) cannot keep accurate: the "
        "precision search's last resort, a layer moved to the CPU."))
    dtypes: list[str] = Field(["float32", "float16"], description=(
        "Tensor dtypes (of the float model, before quantization) the NPU path accepts; an "
        "op's own `dtypes` overrides this. Integer shape arithmetic stays on the CPU."))
    accept_fused_bodies: bool = Field(False, description=(
        "Place a fused op (domain npubuild.fused) that the op table does not name on the NPU "
        "when every node of its body is supported; when false, fused ops must be listed."))
    ops: dict[str, OpSupport] = Field(description="Op type or fused function name -> constraints.")

    @field_validator("ops")
    @classmethod
    def _fields_apply(cls, ops: dict[str, OpSupport]) -> dict[str, OpSupport]:
        from npubuild.targets.constraints import inapplicable_fields

        for op, support in ops.items():
            bad = inapplicable_fields(op, support)
            if bad:
                raise ValueError(f"{op}: {', '.join(bad)} do{'es' * (len(bad) == 1)} not apply "
                                 f"to {op}; remove {'it' if len(bad) == 1 else 'them'}")
        return ops

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        from npubuild import backends

        if not backends.is_known(name):
            raise ValueError(f"unknown backend {name!r}; known: {', '.join(backends.names())}")
        return name

    @model_validator(mode="after")
    def _vendor_kernels_need_a_vendor(self) -> Chip:
        from npubuild.backends import SIMULATED

        named = sorted(op for op, spec in self.ops.items() if spec.vendor_kernel)
        if named and self.backend == SIMULATED:
            raise ValueError(
                f"{', '.join(named)}: vendor_kernel names a vendor toolchain's kernel, and the "
                f"{SIMULATED} backend runs npubuild's own kernels only; remove vendor_kernel, "
                "or give the chip a vendor backend")
        return self

    @model_validator(mode="after")
    def _mac_array_matches_peak(self) -> Chip:
        if self.mac_array is not None:
            peak = self.lanes * self.macs_per_cycle_per_lane
            if self.mac_array.peak_macs_per_cycle != peak:
                raise ValueError(f"mac_array computes {self.mac_array.peak_macs_per_cycle:g} MACs "
                                 f"per cycle at best, lanes x macs_per_cycle_per_lane = {peak}")
        return self

    @cached_property
    def lmem_bytes(self) -> int:
        return self.lanes * self.lmem_bytes_per_lane

    @cached_property
    def bank_bytes(self) -> int:
        return self.lmem_bytes_per_lane // self.lmem_banks

    def digest_data(self) -> dict[str, Any]:
        """What a stage's cache key includes when the stage depends on the chip."""
        return self.model_dump(mode="json")


def chip_json_schema() -> dict:
    from npubuild.schemas.docstrings import describe

    describe(Chip)
    schema = Chip.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "npubuild target chip"
    return schema
