"""Where RKNN's simulator and npubuild's integer reference part, layer by layer.

Given a build of a recipe on an RKNN chip (``compile.quantizer: npubuild``, so the toolkit runs
npubuild's QDQ model), the QDQ model is cut at each named tensor (an Identity of its
DequantizeLinear made a model output), built and run in the toolkit's simulator on compile's
first proof input, and each tensor is read in npubuild's integer steps against npubuild's
integer reference: the share of elements that differ, the 99th percentile and the largest
difference. For a SiLU output whose pre-activation is cut too, it also checks whether the
toolkit's SiLU is the exact SiLU of its own pre-activation, rounded once.

    python3 benchmarks/rknn_layers.py build/yolov8n-rk3588@exp-... \\
        conv:0__1 /model.0/act/Mul_output_0 /model.1/act/Mul_output_0 /model.22/Concat_6_output_0

What it printed for YOLOv8n (all int8: ``-S quantization.auto=false``) is in README, Real chips.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

PROBE = """
import sys, numpy as np
from rknn.api import RKNN
model, proof, out, platform, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
feeds = dict(np.load(proof))
r = RKNN(verbose=False)
r.config(target_platform=platform, optimization_level=3)
assert r.load_onnx(model, inputs=list(feeds), input_size_list=[list(v.shape) for v in feeds.values()],
                   outputs=names) == 0
assert r.build(do_quantization=False) == 0 and r.init_runtime() == 0
got = r.inference(inputs=list(feeds.values()), data_format=["nchw" if v.ndim == 4 else None for v in feeds.values()])
np.savez(out, **{n: np.asarray(v, np.float32) for n, v in zip(names, got)})
"""


def cut(qdq: onnx.ModelProto, tensors: list[str]) -> tuple[onnx.ModelProto, list[str]]:
    """``qdq`` with each tensor (at npubuild's quantization, after its DequantizeLinear) an
    output of its own."""
    outputs = {o.name for o in qdq.graph.output}
    names = []
    for t in tensors:
        if t in outputs:
            names.append(t)
            continue
        qdq.graph.node.append(helper.make_node("Identity", [f"{t}::dq"], [f"{t}::probe"]))
        qdq.graph.output.append(helper.make_tensor_value_info(f"{t}::probe", onnx.TensorProto.FLOAT, None))
        names.append(f"{t}::probe")
    return qdq, names


def main(argv: list[str] | None = None) -> int:
    from npubuild import toolchains
    from npubuild.quant.qgraph import QGraph
    from npubuild.quant.reference import quantize_inputs, run_reference
    from npubuild.toolchains.env import require

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", type=Path, help="build/<name>/ of an RKNN build")
    p.add_argument("tensors", nargs="+")
    p.add_argument("--graph", default="graph_0")
    p.add_argument("--platform", default="rk3588")
    args = p.parse_args(argv)
    context = args.build / "compile" / f"graph_ir_{args.graph.split('_')[-1]}"
    qgraph = QGraph.load(args.build / "quantize" / f"{args.graph}.qgraph.json")
    model, names = cut(onnx.load(context / f"{args.graph}.qdq.onnx"), args.tensors)
    proof = context / "proof" / "sample_0.npz"
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "cut.onnx")
        (Path(tmp) / "probe.py").write_text(PROBE)
        subprocess.run([str(require(toolchains.get("rknn")).python), "probe.py", "cut.onnx",
                        str(proof.resolve()), "out.npz", args.platform, *names],
                       cwd=tmp, check=True, capture_output=True)
        got = dict(np.load(Path(tmp) / "out.npz"))
    ours = run_reference(qgraph, quantize_inputs(qgraph, dict(np.load(proof))))
    print("| tensor | scale | on npubuild's steps | differ | p99 steps | max steps |")
    print("|---|---|---|---|---|---|")
    theirs = {}
    for t, name in zip(args.tensors, names):
        q = qgraph.tensors[t]
        steps = np.ravel(got[name]).astype(np.float64) / q.scale + q.zero_point
        theirs[t] = got[name]
        d = np.abs(np.round(steps) - np.ravel(ours[t]))
        whole = np.max(np.abs(steps - np.round(steps))) < 1e-3
        print(f"| {t} | {q.scale:.5g} | {'yes' if whole else 'no'} | {np.count_nonzero(d) / d.size:.1%} "
              f"| {np.percentile(d, 99):.0f} | {d.max():.0f} |")
    silu_check(qgraph, theirs)
    return 0


def silu_check(qgraph, theirs: dict) -> None:
    """For each cut SiLU output whose pre-activation (its layer's input) is cut too: whether
    the toolkit's SiLU is the exact SiLU of its own pre-activation, rounded once."""
    for layer in qgraph.layers:
        x, y = (layer.inputs or [None])[0], (layer.outputs or [None])[0]
        if x not in theirs or y not in theirs or layer.attrs.get("function") != "SiLU":
            continue
        q = qgraph.tensors[y]
        pre = np.ravel(theirs[x]).astype(np.float64)
        exact = np.clip(np.round(pre / (1 + np.exp(-pre)) / q.scale) + q.zero_point, -128, 127)
        d = np.abs(exact - np.round(np.ravel(theirs[y]) / q.scale + q.zero_point))
        print(f"{y}: the toolkit's SiLU against the exact SiLU of its own {x}, rounded once: "
              f"{np.count_nonzero(d) / d.size:.1%} differ, at most {d.max():.0f} steps")


if __name__ == "__main__":
    sys.exit(main())
