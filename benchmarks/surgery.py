"""Time and node count of ``fold_constants`` (+ the default fusion rules) on the real YOLOv8n
and ONNX's ``light_densenet121``, beside onnxsim / onnxslim when one is installed (neither is a
dependency: ``pip install onnxslim`` just for this comparison). Prints a table (wall time,
median of runs).

    python3 benchmarks/surgery.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def yolov8n():
    import onnx

    from npubuild.recipe.paths import resolve

    from npubuild.onnx_io import fix_input_shapes

    model = onnx.load(str(resolve("pkg:nudenet/320n.onnx", REPO)))
    return fix_input_shapes(model, {"images": [1, 3, 320, 320]})


def densenet121():
    import onnx

    return onnx.load(str(Path(onnx.__file__).parent / "backend/test/data/light/light_densenet121.onnx"))


def ours(model, fuse: bool):
    from npubuild import fusions
    from npubuild.surgery import load_builtins

    rw = load_builtins()["fold_constants"]
    model = rw.apply(model, rw.args())
    if fuse:
        rules = fusions.load_builtins()
        for name in getattr(fusions, "DEFAULT_RULES", ()):
            model, _ = rules[name].apply(model)
    return model


def onnxsim_like():
    """(label, simplify function) for whichever of onnxslim / onnxsim is importable."""
    try:
        import onnxslim

        return "onnxslim", lambda m: onnxslim.slim(m)
    except ImportError:
        pass
    try:
        import onnxsim

        return "onnxsim", lambda m: onnxsim.simplify(m)[0]
    except ImportError:
        return None, None


def timed(fn, model, runs: int):
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn(model)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    other, simplify = onnxsim_like()
    print(f"{'model':<14} {'tool':<26} {'nodes':>7} {'seconds':>9}")
    for label, load in (("yolov8n", yolov8n), ("densenet121", densenet121)):
        model = load()
        print(f"{label:<14} {'(input)':<26} {len(model.graph.node):>7} {'':>9}")
        rows = [("fold_constants", lambda m: ours(m, False)),
                ("fold_constants + fusion", lambda m: ours(m, True))]
        if simplify is not None:
            rows.append((other, simplify))
        for tool, fn in rows:
            seconds, result = timed(fn, model, args.runs)
            print(f"{label:<14} {tool:<26} {len(result.graph.node):>7} {seconds:>9.3f}")
    if simplify is None:
        print("onnxsim / onnxslim not installed: no comparison row (pip install onnxslim)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
