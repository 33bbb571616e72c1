"""Vendor toolchains, each in its own Python environment that npubuild makes and keeps.

Vendor tools pin old stacks (rknn-toolkit2: numpy<=1.26, onnx<=1.18, protobuf<=4.25; tpu-mlir:
Python 3.10), so none can share npubuild's environment. A `Toolchain` says how its environment
is made (pip steps from the package registries only, post-install fixes) and which packages'
exact versions identify it; `npubuild.toolchains.env` finds or makes the environment,
`npubuild.toolchains.process` runs a worker script in it with only files crossing.

Where environments live: ``$NPUBUILD_TOOLCHAINS``, else ``$XDG_CACHE_HOME/npubuild/toolchains``
(``~/.cache/npubuild/toolchains``), one folder ``<name>-<version>`` each; never inside a build
directory. A user may point at an existing environment or interpreter instead:
``NPUBUILD_TOOLCHAIN_RKNN=/opt/rknn-venv`` (a venv folder or a ``python`` executable; the
variable is the toolchain's name upper-cased, ``-`` as ``_``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.registry import Registry


@dataclass(frozen=True)
class Toolchain:
    """One vendor toolchain: how to install it and what identifies it."""

    name: str
    """What users type: `npubuild toolchain install NAME`."""
    package: str
    version: str
    python: str
    """``current`` (the interpreter running npubuild) or a version such as ``3.10``."""
    steps: tuple[tuple[str, ...], ...]
    """pip install argument lists, run in order (each a plain `pip install ...`)."""
    identity: tuple[str, ...]
    """Packages whose exact versions are part of the stage keys."""
    post_install: tuple[str, ...] = ()
    """Names of fixes in `npubuild.toolchains.fixes` run after the steps."""
    size: str = ""
    """The measured size of a fresh environment (shown by `toolchain list`)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def install_command(self) -> str:
        return f"npubuild toolchain install {self.name}"

    @property
    def override_variable(self) -> str:
        return "NPUBUILD_TOOLCHAIN_" + self.name.upper().replace("-", "_")


TOOLCHAINS: Registry[Toolchain] = Registry("toolchain", "npubuild.toolchains")


def register(toolchain: Toolchain) -> Toolchain:
    return TOOLCHAINS.register(toolchain.name, toolchain)


register(Toolchain(
    name="vela", package="ethos-u-vela", version="5.2.0", python="current",
    steps=(("ethos-u-vela==5.2.0",),),
    identity=("ethos-u-vela", "flatbuffers", "numpy"), size="108 MB",
    notes=("compiles a full-int8 TFLite for Arm Ethos-U55/U65/U85",)))

register(Toolchain(
    name="rknn", package="rknn-toolkit2", version="2.5.0", python="3.11",
    # rknn-toolkit2 pins torch<=2.4, which pulls 4 GB of CUDA wheels; the CPU torch 2.13 gives
    # identical simulator outputs (1.5 GB instead of 5.6 GB). Its own requirements come second,
    # with --no-deps first so pip never resolves the torch pin; setuptools<81 keeps the
    # pkg_resources it imports (torch's install would upgrade it past that).
    steps=(("--no-deps", "rknn-toolkit2==2.5.0"),
           ("protobuf>=4.21.6,<=4.25.4", "psutil>=5.9.0", "ruamel.yaml>=0.17.21",
            "scipy>=1.9.3", "tqdm>=4.64.1", "opencv-python-headless>=4.5.5.64",
            "fast-histogram>=0.11", "numpy<=1.26.4", "onnx>=1.16.1,<=1.18.0",
            "onnxruntime>=1.17.0"),
           ("torch==2.13.0", "setuptools<81")),
    identity=("rknn-toolkit2", "onnx", "onnxruntime", "numpy", "torch", "protobuf"),
    size="1.5 GB", notes=("ONNX -> .rknn and its PC simulator (Rockchip RK3588 ...)",)))

register(Toolchain(
    name="tpu-mlir", package="tpu_mlir", version="1.30.2", python="3.10",
    # The ONNX extra (onnx 1.14.1, onnxruntime 1.16.3); psutil and torch are imported but not
    # declared (from PyPI, torch brings its CUDA libraries: most of the size); setuptools<81 keeps
    # the pkg_resources tpu_mlir/__init__.py imports (torch's install lifts it past that).
    steps=(("tpu_mlir[onnx]==1.30.2", "psutil", "torch", "setuptools<81"),),
    identity=("tpu_mlir", "onnx", "onnxruntime", "numpy", "torch"),
    post_install=("move_bundled_glibc",), size="7.4 GB",
    notes=("ONNX -> BM1684X bmodel (Sophgo) and its cmodel simulator; needs Python 3.10",)))


def get(name: str) -> Toolchain:
    """The toolchain called ``name``; an unknown name is the user's error."""
    from npubuild.errors import UserError

    TOOLCHAINS.load_plugins()
    if name not in TOOLCHAINS:
        raise UserError(f"unknown toolchain {name!r}; known: {', '.join(TOOLCHAINS.names())}")
    return TOOLCHAINS[name]


__all__ = ["TOOLCHAINS", "Toolchain", "get", "register"]
