"""Calibration and verification data: files → input tensors, checked, one sample at a time.

Images (``.png .jpg .jpeg .bmp .gif .tif .tiff .webp .ppm .pgm``) feed a model with one image
input: decoded with Pillow, converted to the ``channel_order`` (RGB, BGR or GRAY; alpha
dropped), resized to ``preprocess.resize`` ([height, width], bilinear) or to the input's own
spatial size, then ``(pixel · scale - mean) / std`` per channel, laid out as the input's layout
(NCHW or NHWC; ``any`` is told from where the channel count sits). An input of batch N takes
N consecutive images per sample.

Tensors: ``.npy`` (single-input models) and ``.npz`` (one array per input name, the source
model's name or the one surgery renamed it to; a single-input model also accepts any one key), read with ``allow_pickle=False``. An array is one sample of the
input's shape, or the shape without its batch dim of 1, or a stack ``[k, ...]`` of k samples
for a batch-1 input.

A streaming model's state input (`State`: a TFLite resource variable import made an input, with
the initial value its initialisation gives) need not be in the data: the data then feed the
model's other inputs (a ``.npy`` or images feed the one input that is not a state), and the
consecutive samples of one file are consecutive calls of the model: the first is fed the
state's initial value, each next one the value the float model output for the state on the
call before (`State.step`). Each file starts from the initial state. A state the file holds is
used as given.

Any problem (unreadable file, wrong shape or channel count, NaN or Inf, unknown suffix) is a
``UserError`` naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import lazy_loader as lazy

from npubuild.errors import BuildError, Location, UserError

np = lazy.load("numpy")

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
TENSOR_SUFFIXES = {".npy", ".npz"}


@dataclass(frozen=True)
class State:
    """A streaming model's state input: its value on a stream's first call, the model output
    that holds its value after a call (None: the model does not output it), and ``step``, which
    runs the float model on one complete sample and returns its outputs by name (None: only a
    stream's first call can be fed)."""

    initial: Any = field(compare=False, repr=False)  # np.ndarray
    output: str | None = None
    step: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = field(
        default=None, compare=False, repr=False)


@dataclass(frozen=True)
class InputInfo:
    """One model input as the data loader needs it."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str = "any"
    preprocess: object | None = None  # npubuild.recipe.model.Preprocess
    source: str | None = None  # the source model's (and recipe's) name, when surgery renamed it
    state: State | None = None  # a streaming model's state: the data need not hold it

    @property
    def keys(self) -> tuple[str, ...]:
        """The ``.npz`` keys this input is read from: its name, or the source model's."""
        return tuple(dict.fromkeys([self.name, self.source or self.name]))


def _error(path: Path, message: str, hint: str | None = None) -> UserError:
    return UserError(message, location=Location(str(path)), hint=hint)


@dataclass(frozen=True)
class Source:
    """Where one sample comes from: its image files (N for an input of batch N) or its array
    file, and its place in that file when the file holds a stack of samples. A sample is never
    found by its file's position in the data list: one file may hold many samples, and one
    sample many files."""

    files: tuple[Path, ...]
    index: int | None = None  # the sample's place in a stacked .npy/.npz

    def label(self, spell: Callable[[Path], str] = lambda path: path.name) -> str:
        """``page.png``, ``a.png + b.png`` or ``lines.npy[3]`` (files named by ``spell``)."""
        names = " + ".join(spell(f) for f in self.files)
        return names if self.index is None else f"{names}[{self.index}]"

    @property
    def image(self) -> Path | None:
        """The sample's first image file, if it was made from images."""
        return self.files[0] if self.files[0].suffix.lower() in IMAGE_SUFFIXES else None


def load_samples(files: Sequence[Path], inputs: Sequence[InputInfo],
                 limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yield up to ``limit`` samples ``{input name: array}`` from ``files`` (in order)."""
    return (sample for _, sample in sources_and_samples(files, inputs, limit))


def sources_and_samples(files: Sequence[Path], inputs: Sequence[InputInfo],
                        limit: int | None = None) -> Iterator[tuple[Source, dict[str, np.ndarray]]]:
    """`load_samples` with each sample's `Source`."""
    if not files:
        raise UserError("no calibration files", hint="set quantization.calibration.data to a glob "
                                                      "that matches images or .npy/.npz files")
    produced = 0
    pending: list[np.ndarray] = []
    pending_files: list[Path] = []
    for path in files:
        if limit is not None and produced >= limit:
            return
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            info = _single_input(inputs, path, "an image")
            pending.append(image_tensor(path, info))
            pending_files.append(path)
            if len(pending) == max(1, info.shape[0]):
                array = _finite(path, np.concatenate(pending).astype(info.dtype), info.name)
                yield Source(tuple(pending_files)), next(_stepped([{info.name: array}], inputs))
                produced, pending, pending_files = produced + 1, [], []
        elif suffix in TENSOR_SUFFIXES:
            for index, sample in _stepped(_tensor_samples(path, inputs), inputs, path):
                yield Source((path,), index), sample
                produced += 1
                if limit is not None and produced >= limit:  # before the next is stepped to
                    return
        else:
            raise _error(path, f"cannot use {path.name!r} as calibration data (suffix {suffix!r})",
                         hint="give images (" + ", ".join(sorted(IMAGE_SUFFIXES)) + ") or .npy/.npz")


def _stepped(samples, inputs: Sequence[InputInfo], path: Path | None = None):
    """``samples`` (one file's, in order: dicts, or (index, dict) pairs) with each state input
    the file does not hold fed as the model steps it: its initial value on the first sample, on
    each next one what the float model output for it on the sample before (`State`)."""
    states = [i for i in inputs if i.state is not None]
    previous = None
    for item in samples:
        sample = item[1] if isinstance(item, tuple) else item
        missing = [i for i in states if i.name not in sample]
        outputs = _step(missing, previous, path) if missing and previous is not None else None
        for info in missing:
            value = info.state.initial if outputs is None else outputs[info.state.output]
            sample[info.name] = np.asarray(value).astype(info.dtype).reshape(info.shape)
        previous = sample
        yield item


def _step(states: Sequence[InputInfo], sample: Mapping[str, Any], path: Path | None
          ) -> Mapping[str, Any]:
    """The float model's outputs on ``sample``, which hold the ``states``' next values."""
    cut = [i for i in states if i.state.output is None]
    if cut:
        raise _error(path, f"state input(s) {', '.join(repr(i.name) for i in cut)} are not in "
                           "the data and the model does not output their new value, so only a "
                           "stream's first call can be fed",
                     hint="give each state in the data (an .npz key per state), or keep the "
                          "state outputs (model.outputs, surgery)")
    step = states[0].state.step
    if step is None:
        raise BuildError(f"{path}: a stream of more than one call, but no model to step its "
                         "states with (npubuild.quant.onnx_inputs.input_infos gives one)")
    return step(sample)


def check_images(files: Sequence[Path], inputs: Sequence[InputInfo]) -> None:
    """The checks `load_samples` makes before it decodes an image, on the first image of
    ``files``: the model has one input, and its shape, layout and preprocessing take images."""
    path = next((f for f in files if f.suffix.lower() in IMAGE_SUFFIXES), None)
    if path is not None:
        image_geometry(path, _single_input(inputs, path, "an image"))


def _single_input(inputs: Sequence[InputInfo], path: Path, what: str) -> InputInfo:
    """The one input ``what`` (an image, a .npy) feeds: the model's one input that is not a
    state (`State`)."""
    fed = [i for i in inputs if i.state is None]
    if len(fed) != 1:
        states = len(inputs) - len(fed)
        raise _error(path, f"{what} can only feed a model with one input; this one has "
                           f"{len(fed)} ({', '.join(i.name for i in fed)})"
                           + (f" besides {states} state(s)" if states else ""),
                     hint="give .npz files with one array per input name")
    return fed[0]


def _layout(info: InputInfo, path: Path) -> str:
    shape = info.shape
    if len(shape) != 4:
        raise _error(path, f"an image cannot feed input {info.name!r} of shape {list(shape)} "
                           "(images need a 4-D input)")
    if info.layout in ("NCHW", "NHWC"):
        return info.layout
    return "NCHW" if shape[1] in (1, 3) else "NHWC"


def image_geometry(path: Path, info: InputInfo) -> tuple[str, int, int]:
    """(layout, height, width) an image must take to feed ``info``: a 4-D input whose channels
    the ``channel_order`` gives and whose size ``preprocess.resize`` (if set) gives; else the
    `UserError` `load_samples` would raise on ``path`` (`npubuild validate` asks before any
    image is read)."""
    pre = info.preprocess
    order = getattr(pre, "channel_order", "RGB")
    layout = _layout(info, path)
    h, w = (info.shape[2:] if layout == "NCHW" else info.shape[1:3])
    channels = info.shape[1] if layout == "NCHW" else info.shape[3]
    want = 1 if order == "GRAY" else 3
    if channels != want:
        raise _error(path, f"input {info.name!r} has {channels} channels but images are decoded "
                           f"as {order} ({want} channels)",
                     hint="set model.inputs[].preprocess.channel_order (RGB, BGR or GRAY)")
    size = tuple(getattr(pre, "resize", None) or (h, w))
    if size != (h, w):
        raise _error(path, f"preprocess.resize {list(size)} does not give the input's {h}x{w}",
                     hint="make resize match model.inputs[].shape")
    return layout, h, w


def image_tensor(path: Path, info: InputInfo) -> np.ndarray:
    """One image as a [1, ...] tensor for ``info`` (see the module docstring)."""
    from PIL import Image, UnidentifiedImageError

    pre = info.preprocess
    order = getattr(pre, "channel_order", "RGB")
    layout, h, w = image_geometry(path, info)
    try:
        with Image.open(path) as img:
            img = img.convert("L" if order == "GRAY" else "RGB")
            img = img.resize((w, h), Image.BILINEAR)
            pixels = np.asarray(img, dtype=np.float32)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise _error(path, f"cannot read the image ({type(exc).__name__}: {exc})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if order == "BGR":
        pixels = pixels[:, :, ::-1]
    x = pixels * getattr(pre, "scale", 1.0)
    mean = np.asarray(getattr(pre, "mean", 0.0), np.float32)
    x = (x - mean) / np.asarray(getattr(pre, "std", 1.0), np.float32)
    if layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None], dtype=np.float32)


def _tensor_samples(path: Path, inputs: Sequence[InputInfo]
                    ) -> Iterator[tuple[int | None, dict[str, np.ndarray]]]:
    """Each sample of an array file with its index in the file (None when it holds one)."""
    arrays = _read_arrays(path, inputs)
    per_input = {info.name: _as_samples(path, info, arrays[info.name]) for info in inputs
                 if info.name in arrays}  # a state the file does not hold: `_stepped`
    counts = {len(v) for v in per_input.values()}
    if len(counts) != 1:
        raise _error(path, "the arrays hold different numbers of samples: " + ", ".join(
            f"{k}: {len(v)}" for k, v in per_input.items()))
    count = counts.pop()
    for i in range(count):
        yield (i if count > 1 else None), {name: samples[i] for name, samples in per_input.items()}


MAX_ARRAY_BYTES = 1 << 30  # one data array; a header may not promise more than this


def _check_npy_header(fh, available: int, path: Path, what: str) -> None:
    """Refuse an array whose header declares more bytes than its file holds (a 100-byte .npy
    claiming 114 GiB) or than `MAX_ARRAY_BYTES`, before numpy allocates anything."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy format version {version}")
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read_header(fh)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise _error(path, f"{what} is not a .npy array ({exc})") from None
    if dtype.hasobject:
        raise _error(path, f"cannot read the array file: {what} holds Python objects, not numbers",
                     hint="save plain numeric arrays with numpy.save / numpy.savez")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    holds = available - fh.tell()
    if declared > min(holds, MAX_ARRAY_BYTES):
        raise _error(path, f"{what} declares shape {list(shape)} {dtype} ({declared:,} bytes) but "
                           f"holds {holds:,} bytes" + (f" (at most {MAX_ARRAY_BYTES:,} are read)"
                                                        if declared > MAX_ARRAY_BYTES else ""))


def _check_sizes(path: Path) -> None:
    import zipfile

    if path.suffix.lower() == ".npy":
        with open(path, "rb") as fh:
            _check_npy_header(fh, path.stat().st_size, path, "the file")
        return
    try:
        with zipfile.ZipFile(path) as zf:
            for member in zf.infolist():
                if member.file_size > MAX_ARRAY_BYTES:
                    raise _error(path, f"{member.filename!r} inflates to {member.file_size:,} "
                                       f"bytes; at most {MAX_ARRAY_BYTES:,} are read")
                if member.filename.endswith(".npy"):
                    with zf.open(member) as fh:
                        _check_npy_header(fh, member.file_size, path, repr(member.filename))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise _error(path, f"cannot read the .npz archive ({type(exc).__name__}: {exc})") from None


def _read_arrays(path: Path, inputs: Sequence[InputInfo]) -> dict[str, np.ndarray]:
    _check_sizes(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, MemoryError) as exc:
        raise _error(path, f"cannot read the array file ({type(exc).__name__}: {exc})",
                     hint="save plain numeric arrays with numpy.save / numpy.savez") from None
    if isinstance(loaded, np.ndarray):
        return {_single_input(inputs, path, "a .npy file").name: loaded}
    with loaded:
        keys = list(loaded.files)
        found = {i.name: next((k for k in i.keys if k in keys), None) for i in inputs}
        fed = [i for i in inputs if i.state is None]
        if (len(fed) == 1 and found[fed[0].name] is None and len(keys) == 1
                and not any(found[i.name] for i in inputs)):
            return {fed[0].name: _npz_array(path, loaded, keys[0])}
        missing = [i.source or i.name for i in fed if found[i.name] is None]
        if missing:
            raise _error(path, f"no array for input(s) {', '.join(map(repr, missing))}; the file "
                               f"has {', '.join(map(repr, keys)) or 'none'}",
                         hint="name each array after a model input (numpy.savez(path, **{name: a}))")
        return {i.name: _npz_array(path, loaded, found[i.name]) for i in inputs
                if found[i.name] is not None}


def _npz_array(path: Path, npz, key: str) -> np.ndarray:
    try:
        return npz[key]
    except (ValueError, OSError) as exc:
        raise _error(path, f"cannot read array {key!r} ({exc})") from None


def _as_samples(path: Path, info: InputInfo, array: np.ndarray) -> list[np.ndarray]:
    shape = tuple(info.shape)
    if array.dtype.kind not in "biuf":
        raise _error(path, f"array for {info.name!r} has dtype {array.dtype}, not a number type")
    if array.shape == shape:
        stack = [array]
    elif shape and shape[0] == 1 and array.shape == shape[1:]:
        stack = [array[None]]
    elif shape and shape[0] == 1 and array.ndim == len(shape) and array.shape[1:] == shape[1:]:
        stack = [a[None] for a in array]
    else:
        raise _error(path, f"array for {info.name!r} has shape {list(array.shape)}, the input "
                           f"takes {list(shape)}",
                     hint="one sample of the input's shape, or a stack [k, ...] of samples")
    return [_finite(path, a.astype(info.dtype), info.name) for a in stack]


def _finite(path: Path, array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = int(np.count_nonzero(~np.isfinite(array)))
        raise _error(path, f"{bad} NaN or Inf value(s) in the data for input {name!r}")
    return array
