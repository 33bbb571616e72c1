"""Keras 2 HDF5 models read by Keras 3.

Keras 3's loader for legacy HDF5 files reads a Keras 2 model's top-level layers, but two things
in a Keras 2 (2.2 .. 2.15) configuration stop it where the model itself is plain:

- arguments Keras 3 removed (an LSTM's ``time_major``, always False in a saved model) are
  refused as unknown keyword arguments;
- a wrapper's inner layer (``Bidirectional(LSTM)``, ``TimeDistributed(Dense)``) is read by
  Keras 3's new deserializer, which finds a built-in layer only through its ``module`` key,
  which Keras 2 never wrote ("Could not locate class 'LSTM'").

`load` rewrites the configuration (dropping a removed argument only where its value is what
Keras 3 computes anyway) and gives the built-in layers by name. Where a function's meaning
changed under the same name, the configuration names Keras 2's function instead: Keras 2's
``hard_sigmoid`` is ``0.2·x + 0.5`` clipped, Keras 3's ``relu6(x + 3) / 6``, and the LSTMs
and GRUs of Keras up to 2.2 gate with it by default (``recurrent_activation``), so read by name
they would compute another model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Keras 2 arguments that Keras 3 removed, and the one value Keras 3's layers always compute.
_REMOVED_ARGUMENTS = {"time_major": False}


def keras2_hard_sigmoid(x):
    """Keras 2's ``hard_sigmoid``: clip(0.2·x + 0.5, 0, 1) (Keras 3's is relu6(x + 3) / 6)."""
    import keras

    return keras.ops.clip(x * 0.2 + 0.5, 0.0, 1.0)  # tf2onnx reads Mul(x, 0.2) as HardSigmoid


# Functions whose Keras 3 definition differs from Keras 2's under the same name: the name the
# rewritten configuration gives Keras 2's function (a custom object `load` provides).
_CHANGED_FUNCTIONS = {"hard_sigmoid": ("keras2_hard_sigmoid", keras2_hard_sigmoid)}


def keras3_config(config: Any) -> tuple[Any, list[str]]:
    """`config` (a Keras 2 model configuration, as JSON) rewritten for Keras 3 (a function
    whose meaning changed named as Keras 2's, `_CHANGED_FUNCTIONS`), and what in it Keras 3
    would compute differently (empty when the rewrite is the same model)."""
    changed: dict[str, list[str]] = {}  # what changed -> the layers it is in

    def visit(node: Any, layer: str) -> Any:
        if isinstance(node, list):
            return [visit(item, layer) for item in node]
        if not isinstance(node, dict):
            return node
        inner = node.get("config")
        if "class_name" in node and isinstance(inner, dict):
            layer = str(inner.get("name", node["class_name"]))
        rewritten = {}
        for key, value in node.items():
            if key in _REMOVED_ARGUMENTS and "units" in node:  # a recurrent layer's arguments
                if value != _REMOVED_ARGUMENTS[key]:
                    changed.setdefault(f"{key}={value} (Keras 3 has no {key})", []).append(layer)
                continue
            if isinstance(value, str) and value in _CHANGED_FUNCTIONS:
                # a string names only Keras 3's built-ins; a custom function is named so
                rewritten[key] = {"module": "builtins", "class_name": "function",
                                  "config": _CHANGED_FUNCTIONS[value][0],
                                  "registered_name": "function"}
                continue
            rewritten[key] = visit(value, layer)
        return rewritten

    rewritten = visit(_sequential_as_dict(config), "")
    return rewritten, [f"{what} in layer{'s' if len(layers) > 1 else ''} "
                       f"{', '.join(repr(name) for name in layers)}"
                       for what, layers in changed.items()]


def _sequential_as_dict(config: Any) -> Any:
    """A Sequential's configuration as Keras 2.4 onwards write it (``{"name", "layers"}``, an
    input layer first). Keras 2.0 and 2.1 wrote the list of layers alone, where Keras 3's loader
    stops ("pop expected at most 1 argument, got 2"); up to 2.3 no input layer, the input shape
    on the first layer (``batch_input_shape``), which Keras 3 reads as one axis more ([1, 4]
    becomes [?, ?, 4]). The input layer is named ``<first layer>_input``, as Keras 2 named it."""
    if not (isinstance(config, dict) and config.get("class_name") == "Sequential"):
        return config
    inner = config.get("config")
    if isinstance(inner, list):
        inner = {"name": "sequential", "layers": inner}
    if not isinstance(inner, dict) or not isinstance(inner.get("layers"), list):
        return config
    layers = list(inner["layers"])
    head = layers[0] if layers and isinstance(layers[0], dict) else {}
    first = head.get("config", {}) if isinstance(head.get("config"), dict) else {}
    if head.get("class_name") != "InputLayer" and "batch_input_shape" in first:
        first = dict(first)
        shape = first.pop("batch_input_shape")
        layers[0] = {**layers[0], "config": first}
        layers.insert(0, {"class_name": "InputLayer", "config": {
            "batch_shape": shape, "dtype": first.get("dtype", "float32"),
            "name": f"{first.get('name', 'layer')}_input"}})
    return {**config, "config": {**inner, "layers": layers}}


class ComputesAnotherModel(ValueError):
    """Keras 3 would compute another model than the Keras 2 file's (`load`)."""


def builtin_layers(keras) -> dict[str, type]:
    """Keras 3's built-in layer classes by class name (what a Keras 2 wrapper's inner layer
    names without a module)."""
    layer = keras.layers.Layer
    return {name: cls for name, cls in vars(keras.layers).items()
            if isinstance(cls, type) and issubclass(cls, layer)}


def input_names(path: Path) -> list[str] | None:
    """The input names a Keras file's configuration gives, read without Keras (Keras 3's
    ``.keras`` zip, Keras 2's HDF5 ``model_config``): a functional model's input layers; a
    Sequential's input layer, or where Keras 2 wrote none (the input shape on its first layer)
    ``<first layer>_input``, as Keras 2 named it. Keras 3 names such an input by a counter of
    the process (``keras_tensor``, ``keras_tensor_2``, ...): not a name a recipe can give.
    None when the configuration names no inputs."""
    if path.suffix.lower() == ".keras":
        import zipfile

        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    else:
        config = model_config(path)
    config = _sequential_as_dict(config)
    inner = config.get("config") if isinstance(config, dict) else None
    if not isinstance(inner, dict):
        return None
    layers = inner.get("input_layers")
    if layers:  # [name, 0, 0], or a list of them
        layers = [layers] if isinstance(layers[0], str) else layers
        return [entry[0] for entry in layers]
    first = (inner.get("layers") or [{}])[0]  # a Sequential: its first layer takes the input
    name = first.get("config", {}).get("name")
    if not name:
        return None
    return [name if first.get("class_name") == "InputLayer" else f"{name}_input"]


def model_config(path: Path) -> Any:
    """The model configuration an HDF5 model file holds (``model_config``), or None."""
    import h5py

    with h5py.File(path, "r") as handle:
        raw = handle.attrs.get("model_config")
    if raw is None:
        return None
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


def load(path: Path, keras) -> Any:
    """The Keras 2 HDF5 model at `path`, read by Keras 3 from its rewritten configuration.
    Raises `ComputesAnotherModel` naming what Keras 3 would compute differently, if anything."""
    import h5py

    config, changed = keras3_config(model_config(path))
    if changed:
        raise ComputesAnotherModel("Keras 3 would compute another model: " + "; ".join(changed))
    with tempfile.TemporaryDirectory(prefix="npubuild-keras2-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        with h5py.File(copy, "r+") as handle:
            handle.attrs["model_config"] = json.dumps(config).encode()
        keras2_functions = dict(_CHANGED_FUNCTIONS.values())
        # in scope, not only given: a Bidirectional rebuilds its inner layer from its config
        with keras.saving.custom_object_scope(keras2_functions):
            return keras.models.load_model(str(copy), compile=False,
                                           custom_objects={**builtin_layers(keras),
                                                           **keras2_functions})
