"""The recipe: one pydantic model per section of ARCHITECTURE §2.

This file is the single source of the recipe schema: ``schemas/recipe.schema.json`` is generated
from ``Recipe`` (``npubuild schema recipe``) and a test fails when the file is stale.
Every model forbids unknown keys. Surgery steps form a discriminated union keyed by the step
name, built from the surgery registry, so an unknown step is reported as unknown; a recipe is
validated by `recipe_model_for` its own steps, which imports only their rewrites.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictFloat, StrictInt, Tag,
                      WithJsonSchema, create_model, field_validator, model_validator)

from npubuild import fusions, surgery
from npubuild.errors import did_you_mean

RECIPE_VERSION = 1

DType = Literal["float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"]
Layout = Literal["NCHW", "NHWC", "NC", "NCW", "NWC", "any"]


# strict: YAML has real types, so "7" is not a count and `true` is not 1; no NaN or infinity
# (a NaN threshold compares false and would switch its check off)
# A docstring under a field is its description in the JSON Schema (what editors show), read
# when the schema is generated (`npubuild.schemas.docstrings`), not while every process builds
# the models.
STRICT_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**28  # 1 GiB of float32 per input tensor: beyond it a sample cannot be held


class Strict(BaseModel):
    model_config = STRICT_CONFIG


class Preprocess(Strict):
    """How an image becomes this input tensor (calibration and verify data)."""

    resize: tuple[StrictInt, StrictInt] | None = Field(
        None, strict=False, description="[height, width] to resize images to.")
    scale: float = Field(1.0, description="Multiply pixel values (0..255) by this first.")
    mean: list[float] | float = Field(0.0, description="Subtracted after scaling, per channel.")
    std: list[float] | float = Field(1.0, description="Divided by after subtracting the mean.")
    channel_order: Literal["RGB", "BGR", "GRAY"] = "RGB"
    """Channel order the model expects (images are read as RGB)."""

    @field_validator("resize")
    @classmethod
    def _resize_bounded(cls, resize):
        if resize is not None and (min(resize) < 1 or resize[0] * resize[1] * 3 > MAX_ELEMENTS):
            raise ValueError(f"resize {list(resize)} must be >= 1 and at most {MAX_ELEMENTS:,} "
                             "values per image")
        return resize

    @model_validator(mode="after")
    def _one_value_per_channel(self):
        channels = 1 if self.channel_order == "GRAY" else 3
        for name in ("mean", "std"):
            value = getattr(self, name)
            if isinstance(value, list) and len(value) not in (1, channels):
                raise ValueError(f"{name} has {len(value)} values; {self.channel_order} images "
                                 f"have {channels} channel{'s' * (channels > 1)}: give 1 or {channels}")
        if any(v == 0 for v in (self.std if isinstance(self.std, list) else [self.std])):
            raise ValueError("std must not be 0 (pixels are divided by it)")
        return self


ProofScalar = Union[bool, int, float]


class ProofInput(Strict):
    """What this input gets in every stage's equivalence proof, instead of seeded random values
    (or the first calibration sample, when the calibration data covers the input). Give one of
    ``values``, ``data`` or ``range``."""

    values: list[ProofScalar] | ProofScalar | None = Field(
        None, description="The input's values: one value for every element, or a single value "
                          "repeated (e.g. a sample rate: [16000]); cast to the input's dtype.")
    data: str | None = Field(
        None, description="A .npy file, or a .npz with an array under the input's name; relative "
                          "to the recipe or pkg:<package>/<path>.")
    range: tuple[StrictFloat, StrictFloat] | None = Field(  # YAML gives a list; items stay strict
        None, strict=False, description="Seeded random values in [low, high] (integers: both ends included), "
                          "e.g. token ids [0, 30521].")

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in ("values", "data", "range") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of values, data or range"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range {list(self.range)}: low is above high")
        return self


def _name_may_be_left_out(schema: dict) -> None:
    """The loader names an input written without ``name`` (`load.fill_input_names`): editors
    must not flag it."""
    schema["required"] = [k for k in schema.get("required", []) if k != "name"]
    if not schema["required"]:
        del schema["required"]


class InputSpec(Strict):
    """One model input: its name, the shape and dtype to fix, and how images become it."""

    model_config = ConfigDict(**STRICT_CONFIG, json_schema_extra=_name_may_be_left_out)

    name: str = Field(description="Input tensor name in the model (for TF: 'x:0' or 'x'). May be "
                      "left out where the recipe lists every model input of an ONNX, TFLite or "
                      "Keras model: the unnamed ones take the model's other inputs in order.")
    shape: list[int] | None = Field(
        None, description="Fixes the input's shape (dynamic dims included). Default: the model's.")
    dtype: DType | None = Field(None, description="Default: the model's input dtype.")
    layout: Layout = "any"
    """Axis order of the input (NCHW, NHWC, ...): where images put height, width and channels."""
    preprocess: Preprocess | None = None
    """How calibration and verify images are turned into this input."""
    proof: ProofInput | None = Field(
        None, description="Values for the stages' equivalence proofs (e.g. an integer control "
                          "input that must be 8000 or 16000). Default: the first calibration "
                          "sample where it covers this input, else seeded random values.")
    value: list[ProofScalar] | ProofScalar | None = Field(
        None, description="Build the model for this value of the input (a sample rate, a mode "
                          "flag): import makes it a constant, so control flow it decides becomes "
                          "the branch taken and can run on the NPU; the input leaves the model. "
                          "One value per element, or one value for all.")

    @field_validator("shape")
    @classmethod
    def _positive_dims(cls, shape):
        if shape is None:
            return shape
        if any(d < 1 or d > MAX_DIM for d in shape):
            raise ValueError(f"every dimension must be between 1 and {MAX_DIM} (give the real "
                             "size of dynamic dims; an empty tensor cannot be deployed)")
        if math.prod(shape) > MAX_ELEMENTS:
            raise ValueError(f"{shape} has {math.prod(shape):,} elements; an input may have at "
                             f"most {MAX_ELEMENTS:,} (1 GiB of float32)")
        return shape


ModelFormat = Literal["onnx", "tf_frozen", "saved_model", "keras", "tflite"]


class ModelSpec(Strict):
    """The source model: its file, its inputs and (optionally) where to cut it."""

    path: str = Field(description="Model file: .onnx, frozen .pb, SavedModel dir, .keras/.h5/.hdf5, "
                                  ".tflite; relative to the recipe or pkg:<package>/<path>; a file "
                                  "inside a zip or tar archive as a path through it "
                                  "(pkg:mltk/models/x.mltk.zip/x.tflite).")
    format: ModelFormat | None = Field(None, description="Default: from the file name.")
    inputs: list[InputSpec] = Field(default_factory=list)
    """The model inputs to fix (shape, dtype) and how images feed them."""
    outputs: list[str] | None = Field(None, description="Cut the model at these tensors.")
    opset: int | None = Field(None, ge=7, description="Convert to this opset (default: keep; "
                                                      "TF/TFLite conversions use 17).")
    tolerance: float | None = Field(
        None, ge=0, le=1, description="How far a TensorFlow or TFLite source's outputs may be "
        "from the imported model's on the proof inputs, as a fraction of the scale of the "
        "values involved, beyond the float rounding the model shows in ONNX Runtime itself "
        "(measured); default 1e-4. ONNX sources must be bit-identical.")

    @property
    def layout(self) -> str | None:
        """The layout the inputs declare (the first that is not ``any``), else None."""
        return next((i.layout for i in self.inputs if i.layout != "any"), None)


# Tags no surgery step has (the discriminator below never returns them): they pad a union of
# fewer than two steps, the least a tagged union takes.
_PADDING = ("\0no step", "\0no other step")


class _NoStep(BaseModel):
    model_config = ConfigDict(extra="forbid")


@cache
def _step_model(name: str) -> type[BaseModel]:
    """``{name: args}``: one rewrite's step (its module imported here)."""
    rw = surgery.SURGERY.get(name)
    return create_model(f"Step_{name}", __config__=ConfigDict(extra="forbid", title=name),
                        __doc__=rw.doc or None, **{name: (rw.args, ...)})


@cache
def surgery_steps(names: tuple[str, ...] | None = None) -> Any:
    """One surgery step: a ``{name: args}`` single-key mapping, one variant per rewrite in
    ``names`` (the steps a recipe names: `recipe_model_for`), or per registered rewrite (None,
    as the schema lists them). A name that is no rewrite's is unknown either way, and the
    error lists every registered name."""
    known = surgery.SURGERY.known()
    if not known:
        return dict[str, dict[str, Any]]
    chosen = known if names is None else [name for name in known if name in names]
    variants = [Annotated[_step_model(name), Tag(name)] for name in chosen]
    variants += [Annotated[_NoStep, Tag(tag)] for tag in _PADDING[:max(0, 2 - len(variants))]]

    def step_name(value: Any) -> str | None:
        if isinstance(value, dict) and len(value) == 1:
            name = next(iter(value))
            return None if name in _PADDING else name
        if isinstance(value, BaseModel):
            return next(iter(type(value).model_fields))
        return None

    return Annotated[Union[tuple(variants)], Discriminator(
        step_name, custom_error_type="unknown_step",
        custom_error_message="unknown surgery step",
        custom_error_context={"known": ", ".join(known)})]


class FusionPatternOp(Strict):
    """One op of a user fusion pattern, with the edges that feed it."""

    op: str = Field(description="ONNX op type, e.g. Conv.")
    id: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                           description="How later ops name this one in `inputs` (default: the op "
                                       "type, or <op>_<position> when the type repeats).")
    inputs: list[str | float] | None = Field(
        None, description="What feeds each input, in order: the id of an earlier op, a variable "
                          "(the same name twice is the same tensor; it becomes an input of the "
                          "fused op), '_' for any tensor, or a number for a constant of that "
                          "value. Unlisted inputs are free. Default: input 0 is the previous op.")
    attributes: dict[str, Any] = Field(default_factory=dict,
                                       description="Attribute values this op must have.")
    domain: str = Field("", description="The op's domain (default: ONNX).")


class UserFusionRule(Strict):
    """A fusion rule written in the recipe: a small pattern of ops fused into one named function."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                      description="The rule's name; the fused op is its CamelCase (my_op -> MyOp).")
    pattern: list[str | FusionPatternOp] = Field(
        min_length=1, description="Ops, producer first, the op whose output is kept last. A bare "
                                  "op type takes the previous op as its first input.")
    attributes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Op type -> attribute values the match requires.")
    tolerance: float | None = Field(
        None, gt=0, description="Largest difference allowed in the rule's proof, relative to the "
                                "scale of the values involved (default 1e-5).")

    @model_validator(mode="after")
    def _connected_pattern(self):
        from npubuild.fusions.user import check_user_rule

        check_user_rule(self)
        return self


class FusionOptions(Strict):
    """Options of one built-in fusion rule: ``- conv_bn: {tolerance: 1e-4}``."""

    tolerance: float | None = Field(
        None, gt=0, description="Largest difference allowed in the rule's proof, relative to the "
                                "scale of the values involved (default 1e-5).")


def _fusion_item_kind(value: Any) -> str:
    """The variant of a fusion entry (tags are capitalised so error paths skip them)."""
    if isinstance(value, str):
        return "Rule"
    if isinstance(value, UserFusionRule) or (isinstance(value, dict)
                                             and ({"name", "pattern"} & set(value))):
        return "Pattern"
    return "Options"


def _fusion_rule_names() -> dict:
    """Editors offer and check the registered rule names (the validator below says the same)."""
    return {"type": "string", "enum": fusions.FUSIONS.known(),
            "description": "A fusion rule by name."}


class _OneRuleKey:
    """JSON Schema of ``{rule: {tolerance: ...}}``: one key, a registered rule's name (editors
    flag ``{conv_bnn: ...}`` as they flag the plain name; the validator below says the same)."""

    @staticmethod
    def __get_pydantic_json_schema__(core_schema, handler) -> dict:
        schema = handler(core_schema)
        schema.update(propertyNames=_fusion_rule_names(), minProperties=1, maxProperties=1)
        return schema


FusionItem = Annotated[Union[
    Annotated[str, Tag("Rule"), WithJsonSchema(_fusion_rule_names())],
    Annotated[UserFusionRule, Tag("Pattern")],
    Annotated[dict[str, FusionOptions], Tag("Options"), _OneRuleKey],
], Discriminator(_fusion_item_kind)]


def _chip_names() -> dict:
    """A built-in chip's name, or a chip file: editors flag an unknown chip name."""
    from npubuild.targets import preset_names

    return {"anyOf": [{"type": "string", "enum": preset_names()},
                      {"type": "string", "pattern": r"\.ya?ml$",
                       "description": "A chip YAML file, relative to the recipe."}]}


ChipName = Annotated[str, WithJsonSchema(_chip_names())]


class SplitSpec(Strict):
    """Which nodes run on the NPU and which stay on the CPU."""

    policy: Literal["npu_first", "cpu_only", "manual", "min_cost"] = "npu_first"
    """npu_first: every node the chip supports goes to the NPU; cpu_only: nothing does; manual: as `placement` says; min_cost: the placement with the least estimated time."""
    force_cpu: list[str] = Field(default_factory=list,
                                 description="Node names, op types or output tensor names.")
    force_npu: list[str] = Field(default_factory=list)
    """Node names, op types or output tensor names to put on the NPU even when a cheaper split would not."""
    placement: dict[str, Literal["npu", "cpu"]] = Field(
        default_factory=dict, description="For policy manual: node name -> device.")
    min_npu_nodes: int = Field(1, ge=1, description="Smaller NPU islands go to the CPU.")


class CalibrationSpec(Strict):
    """The data quantization measures activation ranges on, and how ranges are chosen."""

    data: str | list[str] | None = Field(
        None, description="Images or .npy/.npz tensors; globs; pkg:<package>/<glob>.")
    samples: int = Field(8, ge=1, description="Use at most this many samples.")
    method: Literal["minmax", "percentile", "kl", "mse"] | None = Field(
        None, description="How each tensor's range is chosen from what calibration saw: "
                          "min/max, a percentile of |x|, the KL-divergence threshold, or the "
                          "range with the least expected squared error. Unset: min/max, and "
                          "where int8 misses verify's thresholds the precision search chooses "
                          "per tensor by measurement.")
    percentile: float = Field(99.99, gt=50, le=100, description="For method percentile.")


class Override(Strict):
    """Mixed precision: keep named ONNX nodes or tensors out of int8."""

    nodes: list[str] = Field(default_factory=list, description="ONNX node names.")
    tensors: list[str] = Field(default_factory=list, description="Tensor names.")
    precision: Literal["float", "int16", "w16a16"] = Field(
        "float", description="float: run on the CPU in float (the split is refined); int16: "
                             "16-bit activations, where the chip supports them; w16a16: "
                             "16-bit activations and, for the conv, Gemm and MatMul layers "
                             "that read them, 16-bit weights (where int8 weights bound the "
                             "model; chips with int16).")


class AutoPrecisionSpec(Strict):
    """The precision search, on by default: when int8 misses verify's thresholds, the fewest
    tensors kept in int16 (on chips with int16) or in float on the CPU until they hold."""

    enabled: bool = Field(True, description="Search when int8 alone misses verify's thresholds "
                                            "(`auto: false` switches it off).")
    seconds: float = Field(
        600.0, gt=0, description="Time budget: the search stops with the best choice it found. "
                                 "Counted in its work's estimated seconds on a 2-core machine "
                                 "(from the model's size), not the wall clock, so a rebuild "
                                 "anywhere stops at the same choice.")
    min_cosine: float | None = Field(
        None, gt=0, le=1, description="An extra bar beside verify's: every output's cosine "
                                      "over all verify samples and on its worst sample.")
    precision: Literal["int16", "w16a16", "float"] | None = Field(
        None, description="The one precision a chosen tensor may take; default: int16 where "
                          "the chip has it, w16a16 (int16 weights too) where int16 "
                          "activations are not enough, float (on the CPU) where neither is.")
    max_overrides: int | None = Field(
        None, ge=1, description="At most this many tensors (default: no limit); when the "
                                "thresholds need more, the most important ones are kept and "
                                "the report says they were not reached.")
    max_slowdown: float = Field(
        10.0, ge=1, description="The search may make the model at most this many times slower "
        "than int8, priced as the compile stage estimates it: the NPU graphs planned with the "
        "choice's int16 tensors and float layers, each float layer and CPU submodel one ONNX "
        "Runtime run plus its MACs on the host. A choice that needs more is not adopted: int8 "
        "stays, verify fails, and the report says what would pass and its slowdown (set this "
        "to that figure to accept the cost).")


class QuantizationSpec(Strict):
    """How the NPU submodels become int8: scheme, weight granularity, calibration, exceptions."""

    scheme: Literal["pow2_symmetric", "symmetric", "asymmetric"] | None = Field(
        None, description="pow2_symmetric: scales are powers of two and requantizing is a "
                          "shift; symmetric: float scale, zero point 0; asymmetric: float "
                          "scale and zero point. Unset: asymmetric (the finest steps: a ReLU "
                          "output keeps all 256 levels).")
    granularity: Literal["per_tensor", "per_channel"] | None = Field(
        None, description="Weight scales: one per tensor or one per output channel. Unset: "
                          "per_channel (a depthwise layer's channels span orders of magnitude).")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    """The data activation ranges are measured on, and the method."""
    overrides: list[Override] = Field(default_factory=list)
    """Nodes or tensors kept in float (on the CPU) or int16."""
    bias: Literal["int32", "int8_shift"] = Field(
        "int32", description="Bias storage: int32 at the accumulator scale, or (pow2_symmetric) "
                             "int8 with a left shift (bias_shift).")
    bias_correction: bool = Field(
        True, description="Fold the mean output shift caused by weight rounding into the bias "
                          "(from the calibration means of each input channel).")
    weight_rounding: Literal["nearest", "gptq"] | None = Field(
        None, description="How float weights become int8. nearest: each weight to its nearest "
                          "step. gptq: column by column, each rounding error moved onto the "
                          "weights not yet rounded so the layer's output on the calibration "
                          "data stays closest to float (GPTQ). Unset: nearest, and where int8 "
                          "misses verify's thresholds gptq is judged too and kept if it scores "
                          "better.")
    cross_layer_equalization: StrictBool | None = Field(
        None, description="Before calibrating, rescale the channels between consecutive "
                          "convolutions (an inference BatchNormalization folded into its conv "
                          "first; through Relu, LeakyRelu, PRelu, zero Pad, MaxPool, never "
                          "Clip, hard-swish or sigmoid) so both weight tensors span similar "
                          "ranges; the float function is unchanged (proved on each build). "
                          "Unset: off, and where int8 misses verify's thresholds and the "
                          "model has such pairs, judged on and off and kept where it scores "
                          "better.")
    auto: AutoPrecisionSpec | StrictBool = Field(
        default_factory=AutoPrecisionSpec,
        description="The precision search (on by default): the fewest int16/float tensors, "
                    "added to `overrides`, that make verify's thresholds hold; what it chose "
                    "and why is in report.json and recipe.lock. `false` switches it off.")
    int16_where_underflows: bool = Field(
        False, description="On chips with int16: a tensor whose typical value is under 2 int8 "
                          "steps (mean |x|), and the input of a lookup table whose int8 steps alone cost "
                          "its output more than 30 dB SQNR, become int16 (tiny activations and "
                          "steep tables keep their resolution).")
    compare_samples: int = Field(
        4, ge=1, description="The first this many verify samples (verify.data if set, else "
                             "calibration data) give per_layer.json and the ONNX Runtime "
                             "cross-check; accuracy.outputs and the search judge all of "
                             "verify.samples.")

    @field_validator("auto")
    @classmethod
    def _auto_switch(cls, value):
        """``auto: true`` / ``auto: false``: the search with its defaults, or none."""
        return AutoPrecisionSpec(enabled=value) if isinstance(value, bool) else value


class CompileSpec(Strict):
    """How NPU submodels are compiled for the chip: layer groups, memory, the simulator proof."""

    layer_group: bool = Field(
        True, description="Fuse runs of layers into groups that keep activations in LMEM "
                          "(layer groups); false: every layer is its own group.")
    on_no_fit: Literal["error", "cpu"] = Field(
        "error", description="A layer that does not fit LMEM even alone and sliced: fail the "
                             "build naming it (error), or run it on the CPU between groups (cpu).")
    proof_samples: int = Field(
        2, ge=1, le=16, description="Seeded random inputs (full int8 range, then within the "
                                    "calibrated input ranges) on which the simulator must "
                                    "reproduce the integer reference bit for bit.")
    ir_feature_maps: bool = Field(
        True, description="Save every layer's output feature map (HWC .npy) in the IR dump "
                          "compile/graph_ir_<i>/; false: weights, biases and tables only.")
    quantizer: Literal["vendor", "npubuild"] = Field(
        "vendor", description="Real chips: whose int8 decisions the deployed artifact carries: "
        "the vendor toolchain's own quantizer on the recipe's calibration data (vendor), or "
        "npubuild's calibration handed to the vendor (npubuild: a QDQ model for RKNN, the int8 "
        "TFLite written from npubuild's ranges for Vela).")
    compare_quantizers: bool = Field(
        True, description="Real chips: build the other quantizer's artifact too, and report "
        "both side by side (verify runs the deployed one; the other's outputs are compared too).")


class Limits(Strict):
    """Thresholds a verified tensor must reach (unset: reported, not judged)."""

    min_cosine: float | None = Field(
        None, ge=-1, le=1, description="Cosine over all samples, and on every sample whose "
        "reference is not near zero (RMS ≥ 5 % of the tensor's over all samples).")
    min_sqnr_db: float | None = Field(None, description="SQNR over all samples.")
    max_abs: float | None = Field(None, ge=0, description="Largest absolute error.")
    max_range_error: float | None = Field(
        None, ge=0, description="Largest absolute error as a fraction of the reference's range "
        "(max − min) over all samples: meaningful for near-zero and one-element tensors.")
    min_channel_cosine: float | None = Field(
        None, ge=-1, le=1, description="Worst channel's cosine over all samples (channels "
        "spanning ≥ 5 % of the tensor's range).")
    min_sample_cosine: float | None = Field(
        None, ge=-1, le=1, description="Worst sample's cosine (samples whose reference is not "
        "near zero); default: min_cosine.")
    dead_channels: bool | None = Field(
        None, description="Fail on a dead channel — constant in the deployed result where the "
        "reference varies. Default: yes for slices, no for hand-over tensors (reported: a "
        "channel spanning less than one int8 step of the tensor rounds to a constant, and the "
        "outputs it feeds are judged anyway).")


class SliceCheck(Limits):
    """Part of a tensor judged on its own, e.g. YOLOv8's class scores: output0 channels 4.."""

    tensor: str = Field(description="A model output or a tensor an NPU submodel hands over.")
    axis: int = Field(1, description="The axis to cut along.")
    start: int = Field(0, description="First index (negative: from the end).")
    end: int | None = Field(None, description="One past the last index; unset: to the end.")
    name: str | None = Field(None, description="Shown in the report; default tensor[axis=start:end].")
    min_cosine: float | None = Field(
        None, ge=-1, le=1, description="Default: verify.min_cosine. Over all samples, and on "
        "every sample whose reference is not near zero.")

    @property
    def label(self) -> str:
        return self.name or f"{self.tensor}[axis {self.axis}: {self.start}:{'' if self.end is None else self.end}]"


class VerifySpec(Strict):
    """End-to-end check: the deployed pipeline (NPU graphs in the simulator) vs the float model."""

    data: str | list[str] | None = Field(
        None, description="Images or .npy/.npz tensors (globs, pkg:); default: the calibration "
                          "data.")
    samples: int = Field(4, ge=1)
    """Use at most this many verify samples."""
    min_cosine: float = Field(0.99, ge=-1, le=1, description="For every model output: over all "
                              "samples, and on every sample whose reference is not near zero.")
    min_sqnr_db: float | None = Field(None, description="Per model output, if set.")
    max_abs: float | None = Field(None, ge=0, description="Largest allowed absolute error, if set.")
    max_range_error: float | None = Field(
        None, ge=0, description="Per model output, if set: largest absolute error as a fraction "
        "of the reference's range over all samples.")
    min_channel_cosine: float | None = Field(
        None, ge=-1, le=1, description="Per model output, if set: the worst channel's cosine "
        "(axis 1). A dead channel fails whatever this is (unless dead_channels: false).")
    dead_channels: bool = Field(
        True, description="Fail when a model output has a dead channel (axis 1): constant in "
        "the deployed result where the reference varies.")
    min_sample_cosine: float | None = Field(
        None, ge=-1, le=1, description="Per model output: the worst sample's cosine (samples "
        "whose reference is not near zero); default: min_cosine.")
    slices: list[SliceCheck] = Field(
        default_factory=list, description="Parts of outputs or hand-over tensors judged on their "
        "own, e.g. {tensor: output0, axis: 1, start: 4, name: class_scores, min_cosine: 0.9}.")
    handover: Limits = Field(
        default_factory=Limits, description="Thresholds for every tensor an NPU submodel hands "
        "to the CPU (reported always, judged only where set, so an intermediate does not fail "
        "a model whose outputs pass unless asked), dead channels included "
        "(handover.dead_channels: true fails on them).")
    task: Literal["classifier", "detector", "anchor_detector", "text_detection",
                  "text_recognition", "binary_map"] | None = Field(
        None, description="Task-level agreement: classifier — top-1/top-5 agreement; detector — "
        "YOLOv8 box recall (IoU ≥ 0.5, same class); anchor_detector — an SSD-style anchor "
        "detector's outputs [1, anchors, k ≥ 4] box regressors and [1, anchors, fewer] score "
        "logits (MediaPipe's face, palm and pose detectors): the anchors whose sigmoid score "
        "reaches task_threshold (default 0.5) with the same box (IoU ≥ 0.5), over the anchors "
        "either side keeps (with min_task_agreement set, those two outputs' cosines are "
        "reported, not judged); text_detection — IoU of the text maps "
        "binarized at 0.3; text_recognition — the same text from a CTC head's greedy decoding "
        "(the blank: the first or the last class, whichever the float model picks at more steps); binary_map — IoU of the maps binarized at task_threshold (notes "
        "and onsets, speech frames).")
    task_outputs: list[str] | None = Field(
        None, min_length=1, description="The model outputs the task reads (default: the first); "
        "with several, the lowest agreement is judged.")
    task_threshold: float | None = Field(
        None, description="binary_map: the value above which a map element counts as present "
        "(default 0.5); anchor_detector: the score (after the sigmoid) an anchor is kept at "
        "(default 0.5).")
    min_task_agreement: float | None = Field(
        None, ge=0, le=1, description="Threshold on the task's figure (top-1 agreement, box "
        "recall, map IoU, share of samples with the same text), if set.")
    detections: Literal["yolov8"] | None = Field(
        None, description="Find boxes with the float model and with the deployed pipeline on "
                          "every verify image and draw them (verify/detections.png): the outputs "
                          "are YOLOv8's (output0, or the per-scale head tensors p3/p4/p5).")
    class_names: list[str] | None = Field(
        None, description="Detection class names by class id, for the boxes' labels; default: "
                          "the model's `names` metadata (as Ultralytics exports write it), else "
                          "the class ids.")


class RecipeBase(Strict):
    """What every recipe model (`recipe_model`) is: recipes with equal values are equal,
    whichever steps' model validated them."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecipeBase):
            return NotImplemented
        return self.__dict__ == other.__dict__


@cache
def recipe_model(steps: tuple[str, ...] | None = None) -> type[RecipeBase]:
    """The recipe model whose surgery steps are ``steps`` (`surgery_steps`); None: every
    registered rewrite's (`Recipe`, which the schema is generated from). The same ``steps``
    give the same class, so two recipes compare as before."""
    SurgeryStep = surgery_steps(steps)  # noqa: N806 — the annotation below names it

    class Recipe(RecipeBase):
        """A deployment: the model, the rewrites, the split, quantization, the target chip."""

        version: Literal[1] = Field(description="Recipe format version.")
        name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100,
                          description="Names the build directory build/<name>/.")
        model: ModelSpec
        """The source model: file, inputs, outputs."""
        target: ChipName = Field("npu-16m", description="A built-in chip (`npubuild targets`) or a "
                                                   "chip YAML path.")
        targets: list[ChipName] = Field(
            default_factory=list, description="Matrix build: `npubuild run` builds the recipe once "
            "per chip here, as build/<name>@<chip>/, and prints one comparison table; `target` stays "
            "the chip of single-target commands (plan, show, infer).")
        surgery: list[SurgeryStep] = Field(default_factory=list)  # type: ignore[valid-type]
        """Graph rewrites, applied in order; each is checked to keep the model's outputs equal."""
        fusion: list[FusionItem] = Field(  # type: ignore[valid-type]
            default_factory=list, description="Fusion rules in order: a built-in rule's name, "
            "{<rule>: {tolerance: ...}}, or a pattern rule {name: ..., pattern: [...]}.")
        split: SplitSpec = Field(default_factory=SplitSpec)
        """Which nodes run on the NPU and which on the CPU."""
        quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
        """How the NPU submodels become int8."""
        compile: CompileSpec = Field(default_factory=CompileSpec)
        """How NPU submodels are compiled for the chip."""
        verify: VerifySpec = Field(default_factory=VerifySpec)
        """The end-to-end check of the deployed pipeline against the float model."""

        @field_validator("version", mode="before")
        @classmethod
        def _version_is_a_number(cls, version):
            if isinstance(version, bool):  # Literal[1] takes True as 1 even in strict mode
                raise ValueError(f"version must be the number {RECIPE_VERSION}, not {version}")
            return version

        @field_validator("fusion")
        @classmethod
        def _known_fusion_rules(cls, items):
            known = fusions.FUSIONS.known()
            for item in items:
                if isinstance(item, dict) and len(item) != 1:
                    raise ValueError(f"a fusion entry with options names one rule ({{conv_bn: "
                                     f"{{tolerance: 1e-4}}}}), not {len(item)}")
                for name in [item] if isinstance(item, str) else item if isinstance(item, dict) else []:
                    if name not in known:
                        raise ValueError(f"unknown fusion rule {name!r} (known: "
                                         f"{', '.join(known) or '(none)'})"
                                         + did_you_mean(name, known))
            return items

    return Recipe


def recipe_model_for(data: Any) -> type[RecipeBase]:
    """The model that validates ``data`` (a recipe's YAML values) as `Recipe` does, with the
    surgery steps it names only: building every rewrite's argument models, and importing
    their modules, was a fifth of a recipe's validation. A name no rewrite has is unknown to
    both."""
    steps = data.get("surgery") if isinstance(data, dict) else None
    named = {next(iter(step)) for step in steps if isinstance(step, dict) and len(step) == 1} \
        if isinstance(steps, list) else set()
    return recipe_model(tuple(name for name in surgery.SURGERY.known() if name in named))


def __getattr__(name: str) -> Any:
    """`Recipe` (every rewrite's steps) and `SurgeryStep`, built on first use."""
    if name == "Recipe":
        return recipe_model()
    if name == "SurgeryStep":
        return surgery_steps()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def recipe_json_schema() -> dict:
    from npubuild.schemas.docstrings import describe

    recipe = recipe_model()
    describe(recipe)
    schema = recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "npubuild recipe"
    _steps_as_one_object(schema)
    return schema


def _steps_as_one_object(schema: dict) -> None:
    """Write a surgery step as one object whose properties are the step names (at most one).

    pydantic writes the tagged union as a oneOf of one-key objects; editors then offer each
    step twice and report an unknown step as "Missing property" of the first alternative. One
    object offers each name once and reports an unknown name as a property that is not allowed.
    """
    items = schema["properties"]["surgery"]["items"]
    if "oneOf" not in items:
        return
    steps = {}
    for variant in items["oneOf"]:
        step = schema["$defs"].pop(variant["$ref"].rsplit("/", 1)[-1])
        (name, args), = step["properties"].items()
        steps[name] = {**args, "description": step.get("description", name)}
    schema["properties"]["surgery"]["items"] = {
        "type": "object", "properties": steps, "additionalProperties": False,
        "minProperties": 1, "maxProperties": 1,
        "description": "One rewrite: `- <step name>: {arguments}`."}
