"""Hostile recipes: N generated recipes through `npubuild validate` and `npubuild run R import`,
in this process (so 1,000 cases take minutes), each checked for what a user may see:

- no traceback, and exit codes only 0 / 1 / 2;
- exit 2 (bad input) names ``file:line:col``; exit 1 (a failed build) never calls bad input
  npubuild's bug ("internal error", "likely a bug"); ``validate`` never exits 1;
- every case under 2 s and 300 MB: the process's peak resident memory during the case (Linux
  resets the peak per case through ``/proc/self/clear_refs``; it includes the ~200 MB that
  ONNX Runtime and friends hold from the first case on).

Mutations (1-3 per recipe, seeded): value types and numbers (bools, strings for numbers, NaN,
inf, huge and zero dims), unknown, missing, misspelt and duplicated keys, hostile paths
(``pkg:`` escapes and dotted names, ``~user``, FIFOs, devices, folders, symlink loops, lying
``.npy``/``.npz`` headers, globs that match nothing), deep nesting, aliases (billion laughs,
recursive, merge keys) and raw-text damage (syntax errors, tags, tabs).

Hostile models (``--models 200``): mutated copies of a small real ONNX model that fail
``onnx.checker`` (op types, inputs, attributes, initializer dims and types, opsets, IR versions,
duplicate or dangling names, cycles, non-UTF-8 text, damaged external data: a location with a
trailing slash, a NUL, a symlink loop, outside the folder), each named by an otherwise valid
recipe, through the same two commands: every one must exit 2 at the recipe line that names the
model (``model.path``), never 0 and never 1.

    python3 benchmarks/hostile.py [--cases 1000] [--models 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LOCATED = re.compile(r"^error: \S+?:\d+:\d+: ", re.M)
BUG_WORDS = ("internal error", "likely a bug")
MAX_SECONDS, MAX_BYTES = 2.0, 300 << 20

BASE = {
    "version": 1, "name": "hostile",
    "model": {"path": "tiny.onnx", "inputs": [{"name": "x", "shape": [1, 3, 8, 8], "preprocess": {
        "resize": [8, 8], "scale": 0.00392156862745098}}]},
    "quantization": {"scheme": "symmetric",
                     "calibration": {"data": "pkg:skimage/data/[a-c]*.png", "samples": 2}},
    "verify": {"min_cosine": 0.99},
}
HOSTILE_VALUES = [True, False, None, "7", "", "x" * 5000, 0, -1, 2**63, 2**20, 1e308,
                  float("nan"), float("inf"), -0.0, [], {}, [[[[1]]]], {"a": {"b": 1}},
                  "2024-01-01", "0x1F", "1e3", "~", ["a", 1, None]]
HOSTILE_PATHS = ["pkg:onnx//etc/passwd", "pkg:onnx/../nudenet/320n.onnx", "pkg:this.x/y",
                 "pkg:this/y", "pkg:", "pkg:/x", "pkg:nudenet/", "~nosuchuser/m.onnx", "/dev/zero",
                 "fifo.onnx", "folder.onnx", "loop.onnx", "missing.onnx", "*.nothing", "",
                 "big.npy", "liar.npz", "garbage.npy", "trunc.onnx", "data.npy", "../" * 30 + "etc",
                 "n" * 300 + ".onnx", "tiny.onnx\0", "pkg:skimage/data/*.png", "folder.onnx/*"]
KEYS = ["version", "name", "model", "target", "targets", "surgery", "fusion", "split",
        "quantization", "compile", "verify"]


@dataclass
class Outcome:
    command: str
    code: int | None
    seconds: float
    peak: int
    stderr: str
    traceback: bool


def make_fixtures(folder: Path) -> None:
    """The files hostile paths point at: a real model, data, and things that are not files."""
    import numpy as np
    from numpy.lib import format as npy_format

    shutil.copy(REPO / "tests" / "data" / "tiny.onnx", folder / "tiny.onnx")
    (folder / "trunc.onnx").write_bytes((folder / "tiny.onnx").read_bytes()[:200])
    os.mkfifo(folder / "fifo.onnx")
    (folder / "folder.onnx").mkdir()
    (folder / "loop.onnx").symlink_to(folder / "loop.onnx")
    np.save(folder / "data.npy", np.ones((1, 3, 8, 8), np.float32))
    (folder / "garbage.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    with open(folder / "big.npy", "wb") as fh:
        npy_format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                               "shape": (30_000_000_000,)})
    import zipfile

    with zipfile.ZipFile(folder / "liar.npz", "w") as zf, zf.open("x.npy", "w") as fh:
        npy_format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                               "shape": (1, 3, 9000, 9000)})


# -- mutations ------------------------------------------------------------------------------

def leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from leaves(v, path + (i,))
    yield path


def put(data, path, value):
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def pick_path(rng, data):
    return rng.choice([p for p in leaves(data) if p])


def m_type(rng, data, text):
    put(data, pick_path(rng, data), rng.choice(HOSTILE_VALUES))


def m_number(rng, data, text):
    shape = [rng.choice([0, 1, 3, 8, -1, 2**20, 2**31, 2**63, 40000]) for _ in range(rng.randint(0, 6))]
    target = rng.choice([("model", "inputs", 0, "shape"), ("model", "inputs", 0, "preprocess", "resize"),
                         ("quantization", "calibration", "samples"), ("verify", "min_cosine"),
                         ("model", "inputs", 0, "preprocess", "mean")])
    value = shape if "shape" in target or "mean" in target else rng.choice(
        [shape[:2], 0, -5, 2**63, float("nan"), 1e-320, "7", True])
    put(data, target, value)


def m_keys(rng, data, text):
    path = pick_path(rng, data)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    kind = rng.choice(["delete", "unknown", "typo", "many"])
    if isinstance(parent, dict):
        if kind == "delete":
            parent.pop(path[-1], None)
        elif kind == "typo":
            parent[str(path[-1])[::-1]] = parent.pop(path[-1])
        elif kind == "many":
            parent.update({f"k{i}": i for i in range(rng.choice([10, 1000, 30000]))})
        else:
            parent[rng.choice(KEYS + ["bogus", "x" * 200])] = rng.choice(HOSTILE_VALUES)
    else:
        data[rng.choice(["bogus", "nmae", "modle"])] = 1


def m_path(rng, data, text):
    target = rng.choice([("model", "path"), ("quantization", "calibration", "data"),
                         ("verify", "data"), ("target",), ("name",)])
    value = rng.choice(HOSTILE_PATHS)
    put(data, target, [value, value] if rng.random() < 0.2 else value)


def m_nesting(rng, data, text):
    """A placeholder the text stage turns into flow-style nesting (safe_dump would recurse)."""
    put(data, pick_path(rng, data), f"NEST{rng.choice([5, 40, 70, 500, 20000])}")


def nest(match: re.Match) -> str:
    depth = int(match.group(1))
    return "".join("[" if i % 2 else "{k: " for i in range(depth)) + "1" + "".join(
        "]" if i % 2 else "}" for i in reversed(range(depth)))


def m_step(rng, data, text):
    data["surgery"] = rng.choice([[{"fold_constants": {}}], [{"nope": {}}], [{"remove_nodes": {
        "nodes": ["x" * 50]}}], [{"fold_constants": {}, "extract": {}}], ["fold_constants"],
        [{"rename_tensors": {"mapping": {"x": 3}}}]])
    data["fusion"] = rng.choice([[], ["conv_silu"], ["nope"], [{"name": "bad name", "pattern": []}],
                                 [{"name": "ok", "pattern": ["Conv", "Relu"]}]])
    data["split"] = rng.choice([{"policy": "manual"}, {"force_cpu": ["*"]}, {"min_npu_nodes": 0},
                                {"policy": "npu_first", "placement": {"a": "gpu"}}])


# raw-text mutations work on the serialised YAML
def t_aliases(rng, text):
    kind = rng.choice(["laughs", "recursive", "merge", "reuse", "undefined"])
    if kind == "laughs":
        levels = rng.randint(3, 9)
        return text + "lol0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
            f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, levels))
    if kind == "recursive":
        return text + "loop: &r [1, *r]\n"
    if kind == "merge":
        return text.replace("quantization:\n", "base: &b {scheme: asymmetric, bias: int32}\n"
                            "quantization:\n  <<: *b\n", 1)
    if kind == "undefined":
        return text + "x: *nowhere\n"
    return "m: &m {path: tiny.onnx}\n" + text.replace("model:\n", "model:\n  <<: *m\n", 1)


def t_damage(rng, text):
    pos = rng.randrange(max(len(text), 1))
    junk = rng.choice([":", "[", "{", "&", "*", "!!python/object:os.system", "\t", "- ", "'", "\"",
                       "%YAML 1.1\n", "---\n", "\x00", "\ufeff", "? ", "|", ">", "@", "`"])
    return text[:pos] + junk + text[pos:]


def t_duplicate(rng, text):
    line = rng.choice([ln for ln in text.splitlines() if ln and not ln.startswith(" ")] or ["a: 1"])
    return text + line + "\n"


MUTATIONS = [m_type, m_number, m_keys, m_path, m_nesting, m_step]
TEXT_MUTATIONS = [t_aliases, t_damage, t_duplicate]


def hostile_recipe(rng: random.Random) -> str:
    import copy

    data = copy.deepcopy(BASE)
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.7:
            try:
                rng.choice(MUTATIONS)(rng, data, None)
            except (KeyError, IndexError, TypeError):
                pass
    text = re.sub(r"NEST(\d+)", nest, yaml.safe_dump(data, sort_keys=False, width=10_000))
    if rng.random() < 0.4:
        text = rng.choice(TEXT_MUTATIONS)(rng, text)
    return text


# -- running one case -----------------------------------------------------------------------

def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def run_case(argv: list[str]) -> Outcome:
    """``npubuild argv`` in this process: exit code, time, peak Python memory, stderr."""
    from npubuild.cli import main

    err, out = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()  # cli.main configures logging onto this case's stderr
    reset_peak_rss()
    started = time.perf_counter()
    code, crashed = None, False
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 — exactly what this benchmark counts
        import traceback

        crashed = True
        err.write(traceback.format_exc())
    seconds = time.perf_counter() - started
    peak = peak_rss()
    text = err.getvalue()
    return Outcome(argv[0], code, seconds, peak, text, crashed or "Traceback (most recent" in text)


def judge(o: Outcome) -> list[str]:
    problems = []
    if o.traceback:
        problems.append("traceback")
    if o.code not in (0, 1, 2):
        problems.append(f"exit {o.code}")
    if o.code == 2 and not LOCATED.search(o.stderr):
        problems.append("exit 2 without file:line:col")
    if o.code == 1 and (o.command == "validate" or any(w in o.stderr for w in BUG_WORDS)):
        problems.append("bad input reported as a failed build / bug")
    if o.seconds > MAX_SECONDS:
        problems.append(f"{o.seconds:.2f} s")
    if o.peak > MAX_BYTES:
        problems.append(f"{o.peak >> 20} MB")
    return problems


def run_all(cases: int, seed: int, workdir: Path, log=print) -> dict:
    """Generate and run ``cases`` recipes in ``workdir``; returns the tally."""
    make_fixtures(workdir)
    base = workdir / "base.yaml"  # warm-up: imports and first-use costs are not a case's
    base.write_text(yaml.safe_dump(BASE, sort_keys=False))
    run_case(["run", str(base), "import", "--build-dir", str(workdir / "warm"), "--cache",
              str(workdir / "warm-cache")])
    rng = random.Random(seed)
    cache = workdir / "cache"
    tally = {"cases": cases, "runs": 0, "codes": {}, "tracebacks": 0, "exit2": 0, "exit2_located": 0,
             "max_seconds": 0.0, "max_mb": 0.0, "failures": []}
    for i in range(cases):
        recipe = workdir / f"case{i:04d}.yaml"
        recipe.write_text(hostile_recipe(rng), encoding="utf-8", errors="surrogatepass")
        for argv in (["validate", str(recipe)],
                     ["run", str(recipe), "import", "--build-dir", str(workdir / "build"),
                      "--cache", str(cache), "--wait", "5"]):
            o = run_case(argv)
            tally["runs"] += 1
            tally["codes"][o.code] = tally["codes"].get(o.code, 0) + 1
            tally["tracebacks"] += o.traceback
            tally["exit2"] += o.code == 2
            tally["exit2_located"] += o.code == 2 and bool(LOCATED.search(o.stderr))
            tally["max_seconds"] = max(tally["max_seconds"], o.seconds)
            tally["max_mb"] = max(tally["max_mb"], o.peak / 2**20)
            problems = judge(o)
            if problems:
                tally["failures"].append((recipe.name, argv[0], problems, o.stderr[-400:]))
                log(f"{recipe.name} {argv[0]}: {', '.join(problems)}\n{o.stderr[-400:]}")
        shutil.rmtree(workdir / "build", ignore_errors=True)
    return tally


# -- hostile models ---------------------------------------------------------------------------

MODEL_LOCATED = re.compile(r"^error: \S+?:\d+:\d+: model\.path: ", re.M)


def base_model():
    """A small model with the kinds of nodes mutations can break: Conv, Relu, a Constant,
    Reshape, Concat, Resize, Gemm (fixed input [1, 3, 8, 8], output [1, 10])."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
             numpy_helper.from_array(rng.standard_normal((10, 128)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"], "relu"),
             helper.make_node("Constant", [], ["half"], "half",
                              value=numpy_helper.from_array(np.full((1, 4, 8, 8), 0.5, np.float32))),
             helper.make_node("Mul", ["relu", "half"], ["mul"], "mul"),
             helper.make_node("Concat", ["relu", "mul"], ["cat"], "cat", axis=1),
             helper.make_node("Resize", ["cat", "", "scales"], ["small"], "resize", mode="nearest"),
             helper.make_node("Reshape", ["small", "flat"], ["flat_out"], "reshape"),
             helper.make_node("Gemm", ["flat_out", "fc"], ["y"], "gemm", transB=1)]
    graph = helper.make_graph(nodes, "base", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="PRODUCER")
    onnx.checker.check_model(model, full_check=True)
    return model


def _pick(rng, items):
    return items[rng.randrange(len(items))]


def mutate_model(rng: random.Random, model) -> tuple[object, str]:
    """One structural mutation of ``model`` (in place) and its name."""
    import onnx
    from onnx import helper

    g = model.graph
    node = _pick(rng, g.node)
    init = _pick(rng, g.initializer)
    kind = rng.choice(["op", "input", "dangling", "attribute", "attr_type", "dims", "dtype",
                       "input_type", "opset", "ir", "duplicate_output", "output", "domain",
                       "cycle", "no_input", "duplicate_init", "raw_size", "node_name_dup",
                       "empty_attr", "value_info", "output_count"])
    if kind == "op":
        node.op_type = rng.choice(["Nope", "", "conv", "Conv2D", "x" * 300, "Relu6", "Gemm"])
    elif kind == "input":
        if node.input and rng.random() < 0.5:
            del node.input[rng.randrange(len(node.input))]
        else:
            node.input.extend(["x"] * rng.randint(1, 4))
    elif kind == "dangling":
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["nowhere", "y", "", "w "])
    elif kind == "attribute":
        if node.attribute and rng.random() < 0.5:
            del node.attribute[rng.randrange(len(node.attribute))]
        else:
            node.attribute.append(helper.make_attribute(rng.choice(["bogus", "axis", "pads"]),
                                                        rng.choice([1, 2.5, "s", [1, 2]])))
    elif kind == "attr_type":
        for attr in node.attribute:
            attr.type = rng.choice([onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING,
                                    onnx.AttributeProto.GRAPH, onnx.AttributeProto.UNDEFINED])
    elif kind == "dims":
        init.dims[:] = [rng.choice([0, 1, 2, 7, 10_000, -3]) for _ in range(rng.randint(0, 5))]
    elif kind == "dtype":
        init.data_type = rng.choice([0, 8, 16, 99, onnx.TensorProto.INT64])
    elif kind == "input_type":
        g.input[0].type.tensor_type.elem_type = rng.choice([0, 8, 99])
    elif kind == "opset":
        if rng.random() < 0.3:
            del model.opset_import[:]
        else:
            model.opset_import[0].version = rng.choice([0, 1, 5, 999])
    elif kind == "ir":
        model.ir_version = rng.choice([0, 1, 2, 99])
    elif kind == "duplicate_output":
        other = _pick(rng, g.node)
        if other.output and node.output:
            node.output[0] = other.output[0] if other is not node else "x"
    elif kind == "output":
        g.output[0].name = rng.choice(["nowhere", "", "w"])
    elif kind == "domain":
        node.domain = rng.choice(["ai.onnx.ml", "com.microsoft.bogus", "ai.onnx.preview.training"])
    elif kind == "cycle":
        last = g.node[len(g.node) - 1]
        g.node[0].input[0] = last.output[0]
    elif kind == "no_input":
        del g.input[:]
    elif kind == "duplicate_init":
        g.initializer.append(init)
    elif kind == "raw_size":
        if init.raw_data:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data))]
        else:
            init.dims.append(3)
    elif kind == "node_name_dup":
        g.node.append(node)
    elif kind == "empty_attr":
        node.attribute.append(onnx.AttributeProto())
    elif kind == "value_info":
        g.value_info.append(helper.make_tensor_value_info(
            node.output[0] if node.output else "x", onnx.TensorProto.FLOAT,
            [rng.choice([2, 9, 0]) for _ in range(rng.randint(1, 5))]))
    elif kind == "output_count":
        node.output.extend(["extra"] * rng.randint(1, 3))
    return model, kind


def failing_models(count: int, seed: int) -> list[tuple[bytes, str]]:
    """``count`` serialized mutants of `base_model` that ``onnx.checker`` (full check) refuses
    even without their ``value_info`` (stale shapes there are forgotten by import, not bad)."""
    import onnx

    rng = random.Random(seed)
    out = []
    while len(out) < count:
        model, kinds = base_model(), []
        for _ in range(rng.randint(1, 2)):
            kinds.append(mutate_model(rng, model)[1])
        checked = onnx.ModelProto()
        checked.CopyFrom(model)
        del checked.graph.value_info[:]
        try:
            onnx.checker.check_model(checked, full_check=True)
        except Exception:  # noqa: BLE001 — the checker's many exception types: a mutant kept
            out.append((model.SerializeToString(), "+".join(kinds)))
    return out


def damaged_models(folder: Path) -> dict[str, str]:
    """Models a protobuf parser reads but no loader should trust: non-UTF-8 text, external
    data whose location ends in a slash, holds a NUL, is a symlink loop or leaves the folder.
    Returns file name -> what is wrong with it."""
    import onnx

    raw = base_model().SerializeToString()
    cases = {}
    for field, tag in (("producer", b"PRODUCER"), ("node name", b"reshape"),
                       ("tensor name", b"flat_out")):
        name = f"utf8_{field.replace(' ', '_')}.onnx"
        assert tag in raw
        (folder / name).write_bytes(raw.replace(tag, b"\xff" + tag[1:], 1))
        cases[name] = f"non-UTF-8 {field}"
    for label, location in (("slash", "w.bin/"), ("nul", "w.bin\0"), ("loop", "loop.bin"),
                            ("outside", "../../etc/passwd"), ("folder", "sub")):
        sub = folder / f"ext_{label}"
        sub.mkdir(exist_ok=True)
        (sub / "sub").mkdir(exist_ok=True)
        model = base_model()
        tensor = model.graph.initializer[0]
        (sub / "w.bin").write_bytes(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=location)
        if label == "loop" and not (sub / "loop.bin").is_symlink():
            (sub / "loop.bin").symlink_to("loop.bin")
        (sub / "model.onnx").write_bytes(model.SerializeToString())
        cases[f"ext_{label}/model.onnx"] = f"external data at {location!r}"
    return cases


def model_recipe(model_path: str) -> str:
    data = {**BASE, "model": {**BASE["model"], "path": model_path}}
    return yaml.safe_dump(data, sort_keys=False)


def judge_model(o: Outcome) -> list[str]:
    problems = [p for p in judge(o) if not p.endswith((" s", " MB"))]
    if o.code != 2:
        problems.append(f"exit {o.code}, not 2")
    elif not MODEL_LOCATED.search(o.stderr):
        problems.append("not located at model.path")
    return problems


def run_models(count: int, seed: int, workdir: Path, log=print) -> dict:
    """The damaged models and ``count`` checker-failing mutants, each through ``validate`` and
    ``run R import``; returns the tally (failures: what was not exit 2 at model.path)."""
    folder = workdir / "models"
    folder.mkdir(exist_ok=True)
    cases = list(damaged_models(folder).items())
    for i, (raw, kinds) in enumerate(failing_models(count, seed)):
        name = f"mutant{i:03d}.onnx"
        (folder / name).write_bytes(raw)
        cases.append((name, kinds))
    tally = {"models": len(cases), "runs": 0, "codes": {}, "failures": []}
    for i, (name, what) in enumerate(cases):
        recipe = workdir / f"model{i:03d}.yaml"
        recipe.write_text(model_recipe(f"models/{name}"))
        for argv in (["validate", str(recipe)],
                     ["run", str(recipe), "import", "--build-dir", str(workdir / "build"),
                      "--cache", str(workdir / "model-cache")]):
            o = run_case(argv)
            tally["runs"] += 1
            tally["codes"][o.code] = tally["codes"].get(o.code, 0) + 1
            problems = judge_model(o)
            if problems:
                tally["failures"].append((name, what, argv[0], problems, o.stderr[-300:]))
                log(f"{name} ({what}) {argv[0]}: {', '.join(problems)}\n{o.stderr[-300:]}")
        shutil.rmtree(workdir / "build", ignore_errors=True)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--models", type=int, default=200,
                        help="checker-failing mutated models (besides the damaged ones)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        tally = run_all(args.cases, args.seed, Path(tmp))
        models = run_models(args.models, args.seed, Path(tmp))
    total = time.perf_counter() - started
    located = tally["exit2_located"] / max(tally["exit2"], 1)
    print("| recipes | runs | exit 0 / 1 / 2 / other | tracebacks | exit 2 with file:line:col "
          "| slowest run | peak memory | failures | wall time |")
    print("|---|---|---|---|---|---|---|---|---|")
    codes = tally["codes"]
    other = sum(v for k, v in codes.items() if k not in (0, 1, 2))
    print(f"| {tally['cases']} | {tally['runs']} | {codes.get(0, 0)} / {codes.get(1, 0)} / "
          f"{codes.get(2, 0)} / {other} | {tally['tracebacks']} | {located:.1%} | "
          f"{tally['max_seconds']:.2f} s | {tally['max_mb']:.0f} MB | {len(tally['failures'])} | "
          f"{total:.0f} s |")
    print()
    print("| hostile models | runs | exit 0 / 1 / 2 / other | not exit 2 at model.path |")
    print("|---|---|---|---|")
    codes = models["codes"]
    other = sum(v for k, v in codes.items() if k not in (0, 1, 2))
    print(f"| {models['models']} | {models['runs']} | {codes.get(0, 0)} / {codes.get(1, 0)} / "
          f"{codes.get(2, 0)} / {other} | {len(models['failures'])} |")
    return 1 if tally["failures"] or models["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
