"""Weight rounding that keeps each layer's output, not each weight, closest to float.

Rounding every weight to its nearest int8 step is what most int8 flows do, and on some real
models it is what bounds the result: YOLOv8n's class scores reach a cosine of 0.986 with int8
weights alone (every activation float), and 0.981 with every activation int16. GPTQ (Frantar
et al., "OPTQ: Accurate Quantization for Generative Pre-trained Transformers", ICLR 2023)
rounds a layer's weights one input column at a time and moves each column's rounding error
onto the columns not yet rounded, weighted by the inverse of the layer's input Gram matrix
``H = Σ x xᵀ`` (x: one output position's input patch, from calibration). It minimises
``‖(W_q - W) X‖`` over the calibration inputs, so the *output* error shrinks: the same
YOLOv8n weights rounded this way give 0.9999 on the class scores of photos calibration never
saw. The integers and scales keep their form; nothing downstream changes.

``PatchGram`` accumulates ``H`` per conv input and geometry while calibration observes the
tensor (`npubuild.quant.calibrators.TensorStats`): during calibration where the recipe asks
for ``gptq``, in a second pass where the quantize stage measures it after int8 missed;
``rounded_weights`` turns a layer's float weights and scales into its int8 weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.quant import reference, schemes

# A layer with more inputs per output than this keeps nearest rounding: its Gram matrix
# (K² float64) and the O(K³) factorisation grow past what one quantize should spend (a 3x3
# conv over 512 channels: K = 4608, 170 MB and 10^11 operations; VGG-19's first fully
# connected layer: K = 25088, 5 GB). YOLOv8n's widest, 3x3 over 256 channels, is within.
MAX_GRAM_INPUTS = 2304
# The Gram matrix's diagonal is damped by this share of its mean, as GPTQ does: input
# directions calibration never excites are then left at nearest rounding instead of taking
# unbounded corrections.
DAMPING = 0.01
# GPTQ needs many more input patches than inputs per output: with fewer, the Gram matrix has
# directions calibration never excited, and the rounding errors moved there are unchecked on
# other inputs. A 3x3 map read with a 3x3 stride gives one patch per sample: MediaPipe face
# landmark's last conv has 288 inputs and the zoo calibrates it on 4 faces. Below this many
# patches per input a layer keeps nearest rounding.
MIN_PATCHES_PER_INPUT = 8
COLUMN_BLOCK = 128          # columns rounded between two matrix updates of the rest
PATCH_ELEMENTS = 1 << 22    # patch rows gathered at once (float32: 16 MiB)
WEIGHT_BOUND = 127          # symmetric int8 weights, as nearest rounding gives them


@dataclass(frozen=True)
class Geometry:
    """What a conv layer reads of its input: the patch each output position multiplies."""

    fc: bool
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]   # top, bottom, left, right
    group: int

    @classmethod
    def of(cls, layer) -> "Geometry":
        a = layer.attrs
        return cls(bool(a.get("fc")), tuple(a["kernel"]), tuple(a["stride"]),
                   tuple(a["dilation"]), tuple(a["pads"]), int(a["group"]))


def inputs_per_output(layer) -> int:
    """K: the weights one output element multiplies (per group)."""
    return int(np.prod(layer.weights["weight"].shape[1:]))


def wants_gram(layer) -> bool:
    """Whether GPTQ can do anything for this conv layer: more than one input per output
    (a batchnorm or a per-channel scale has one) and a Gram matrix of bounded size."""
    return 1 < inputs_per_output(layer) <= MAX_GRAM_INPUTS


@dataclass
class PatchGram:
    """``Σ p pᵀ`` over every input patch ``p`` one geometry reads from a tensor, per group."""

    geometry: Geometry
    grams: list[np.ndarray] | None = field(default=None, repr=False)
    patches: int = 0            # per group: output positions seen, over all samples
    # (layer, weight scales) -> rounded weights: the precision search quantizes the same
    # layer under hundreds of choices, and the rounding depends on neither
    rounded: dict = field(default_factory=dict, repr=False, compare=False)

    def update(self, x: np.ndarray) -> None:
        patches = 0
        for g, (gram, patches) in enumerate(_patch_grams(np.asarray(x), self.geometry)):
            self._add(g, gram)
        self.patches += patches  # every group sees the same positions

    def enough_patches(self, inputs: int) -> bool:
        """Whether calibration saw enough patches to trust GPTQ with ``inputs`` per output."""
        return self.patches >= MIN_PATCHES_PER_INPUT * inputs

    def _add(self, g: int, gram: np.ndarray) -> None:
        if self.grams is None:
            self.grams = [None] * self.geometry.group
        self.grams[g] = gram if self.grams[g] is None else self.grams[g] + gram

    def merge(self, later: "PatchGram") -> None:
        """Add the patches of samples observed after these ones."""
        for g, gram in enumerate(later.grams or []):
            if gram is not None:
                self._add(g, gram)
        self.patches += later.patches

    def __getstate__(self):  # the memo is this process's, never sent to or from a worker
        return {"geometry": self.geometry, "grams": self.grams, "patches": self.patches}

    def __setstate__(self, state):
        self.__init__(state["geometry"], state["grams"], state["patches"])


def _patch_grams(x: np.ndarray, geo: Geometry):
    """Per group, the Gram matrix of ``x``'s patches as ``geo`` reads them, in the order of
    the weight's flattened ``(cin_g, kh, kw)`` axes, and how many patches it sums."""
    if geo.fc:
        rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
        yield rows.T @ rows, rows.shape[0]
        return
    attrs = {"kernel": geo.kernel, "stride": geo.stride, "dilation": geo.dilation}
    view = reference.windows(reference.pad_spatial(x, geo.pads, 0.0), attrs)  # N C kh kw OH OW
    n, channels, kh, kw, oh, ow = view.shape
    cin_g = channels // geo.group
    k = cin_g * kh * kw
    step = max(1, PATCH_ELEMENTS // max(1, n * ow * k))  # output rows per gathered block
    for g in range(geo.group):
        part = view[:, g * cin_g:(g + 1) * cin_g]
        gram = np.zeros((k, k))
        for r in range(0, oh, step):
            # float32 products (half the copy, twice the BLAS rate), summed in float64
            rows = np.ascontiguousarray(part[:, :, :, :, r:r + step].transpose(0, 4, 5, 1, 2, 3),
                                        np.float32).reshape(-1, k)
            gram += rows.T @ rows
        yield gram, n * oh * ow


def rounded_weights(layer, weight: np.ndarray, scale: np.ndarray,
                    gram: PatchGram | None) -> np.ndarray:
    """int8 weights of a conv layer at per-output-channel ``scale``: GPTQ where ``gram`` has
    its calibration patches, else nearest rounding (round half to even, as QuantizeLinear);
    kept on ``gram`` per layer and scales either way (the search quantizes a layer again
    under every choice: one GPTQ can't use was rounded to nearest each time)."""
    scale = np.broadcast_to(np.asarray(scale, np.float64), (weight.shape[0],))
    if gram is None:
        return nearest(weight, scale)
    key = (layer.name, scale.tobytes())
    if key not in gram.rounded:
        gram.rounded[key] = _rounded(weight, scale, gram)
    return gram.rounded[key]


def _rounded(weight: np.ndarray, scale: np.ndarray, gram: PatchGram) -> np.ndarray:
    grams = gram.grams
    if (not grams or any(h is None for h in grams)
            or not gram.enough_patches(int(np.prod(weight.shape[1:])))):
        return nearest(weight, scale)
    cout, groups = weight.shape[0], len(grams)
    flat = weight.reshape(groups, cout // groups, -1)
    return grouped_gptq(flat, grams, scale.reshape(groups, -1)).reshape(weight.shape)


BLOCK_ELEMENTS = 1 << 20


def nearest(weight: np.ndarray, scale: np.ndarray, dtype: str = "int8") -> np.ndarray:
    """Each weight rounded to its nearest step of ``dtype`` (int8, or int16 for a W16A16
    layer), in slices of about ``BLOCK_ELEMENTS`` (float64 arithmetic on a 100M-parameter Gemm
    at once needs GBs of temporaries)."""
    out = np.empty(weight.shape, schemes.DTYPES[dtype])
    shape = (-1,) + (1,) * (weight.ndim - 1)
    for rows in row_blocks(weight):
        out[rows] = schemes.quantize(weight[rows], scale[rows].reshape(shape), 0, dtype)
    return out


def row_blocks(w: np.ndarray) -> list[slice]:
    """Slices of ``w``'s output channels of about ``BLOCK_ELEMENTS`` elements each."""
    step = max(1, BLOCK_ELEMENTS // max(1, int(np.prod(w.shape[1:]))))
    return [slice(r, r + step) for r in range(0, w.shape[0], step)]


def grouped_gptq(weights: np.ndarray, grams: list[np.ndarray], scales: np.ndarray) -> np.ndarray:
    """`gptq` of each group ``g``'s ``weights[g]`` (rows × K) by its ``grams[g]`` at
    ``scales[g]``, as int8 (groups × rows × K). A depthwise conv has one row per group and
    hundreds of groups (PP-OCR's recognisers: 3,085 calls of `gptq` in one searched
    quantize, mostly on 9 × 9 matrices): groups within one column block (K ≤ `COLUMN_BLOCK`,
    where `gptq` multiplies no matrices) are rounded together, each stacked factorisation
    LAPACK's own per matrix and the column sweep element-wise, so every group's integers are
    the ones `gptq` gives it alone (tests/unit/quant/test_rounding.py)."""
    groups, k = len(grams), weights.shape[-1]
    damping = [DAMPING * float(np.diag(h).mean()) if k else 0.0 for h in grams]
    if groups == 1 or k > COLUMN_BLOCK or not all(d > 0 and np.isfinite(d) for d in damping):
        return np.stack([gptq(w, h, s) for w, h, s in zip(weights, grams, scales)])
    try:
        upper = _inverse_upper_factors(np.stack(grams) + np.asarray(damping)[:, None, None]
                                       * np.eye(k))
    except np.linalg.LinAlgError:  # one group's is not positive definite: each on its own
        return np.stack([gptq(w, h, s) for w, h, s in zip(weights, grams, scales)])
    q, _ = _rounded_columns(np.array(weights, np.float64).swapaxes(1, 2), upper, scales)
    return q.swapaxes(1, 2).astype(schemes.DTYPES["int8"])


def _inverse_upper_factors(damped: np.ndarray) -> np.ndarray:
    """Upper Cholesky factors of the inverses of ``damped`` (… × K × K, positive definite):
    row j carries column j's rounding error onto the later columns. On one BLAS thread:
    LAPACK's blocked factorisations split their work by the thread count, and from K = 144 on
    two threads gave other last bits than one, so the integers depended on the machine's
    cores (and one thread costs less CPU: 98 -> 38 ms at K = 576)."""
    with reference.one_blas_thread():
        lower = np.linalg.cholesky(damped)
        lower_inv = np.linalg.inv(lower)
        return np.linalg.cholesky(np.swapaxes(lower_inv, -1, -2) @ lower_inv).swapaxes(-1, -2)


def _rounded_columns(block: np.ndarray, upper: np.ndarray, scale: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ's sweep over one block of columns (``block``: … × B × rows, float64, changed in
    place; ``upper``: its … × B × B factor; ``scale``: … × rows): each column rounded and its
    error, scaled, carried onto the block's later columns. Returns the rounded columns and
    their scaled errors (what the columns after the block take)."""
    q, errors = np.empty_like(block), np.empty_like(block)
    for j in range(block.shape[-2]):
        column = block[..., j, :]
        q[..., j, :] = np.clip(schemes.round_half_even(column / scale), -WEIGHT_BOUND,
                               WEIGHT_BOUND)
        errors[..., j, :] = (column - q[..., j, :] * scale) / upper[..., j, j, None]
        block[..., j + 1:, :] -= upper[..., j, j + 1:, None] * errors[..., j, None, :]
    return q, errors


def gptq(weight: np.ndarray, gram: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """GPTQ's rounding of ``weight`` (cout × K) at per-row ``scale`` given the inputs' Gram
    matrix ``gram`` (K × K): int8, ``|q| ≤ 127``. Falls back to nearest rounding when the
    damped Gram matrix is not positive definite (no input was ever non-zero)."""
    k = weight.shape[1]
    diagonal = np.diag(gram)
    damping = DAMPING * float(diagonal.mean()) if k else 0.0
    if damping <= 0 or not np.isfinite(damping):
        return nearest(weight, scale)
    try:
        upper = _inverse_upper_factors(gram + damping * np.eye(k))
    except np.linalg.LinAlgError:
        return nearest(weight, scale)
    remaining = np.array(weight, np.float64).T  # K × cout: one input column per row
    q = np.empty_like(remaining)
    for start in range(0, k, COLUMN_BLOCK):
        stop = min(start + COLUMN_BLOCK, k)
        q[start:stop], errors = _rounded_columns(remaining[start:stop],
                                                 upper[start:stop, start:stop], scale)
        remaining[stop:] -= upper[start:stop, stop:].T @ errors
    return q.T.astype(schemes.DTYPES["int8"])
