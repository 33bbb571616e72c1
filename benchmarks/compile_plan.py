"""Plan quantized graphs with whichever npubuild this interpreter imports; print JSON.

`benchmarks/compile.py --baseline-tree DIR` runs this file with ``PYTHONPATH=DIR``, so an older
checkout's compiler plans the very quantized graphs the current one compiled (only the grouping
and its estimate differ). It uses only the compiler's long-standing entry points
(``layers_from_qgraph``, ``plan_qgraph``, ``build_program``, ``estimate``), and never adds this
checkout to ``sys.path``.

    PYTHONPATH=DIR python3 benchmarks/compile_plan.py CHIP LAYER_GROUP ON_NO_FIT QUANTIZE_DIR

prints ``{"graphs": {name: {groups, gmem_bytes, gmem_lower_bound, weight_bytes, cycles,
lmem_peak_bytes, plan_s, plan_sha256}}, "clock_hz": ..., "npubuild": path}`` or
``{"error": message}`` when that compiler cannot plan them. ``plan_s`` times the layer list, the
group search (`plan_qgraph`), the program and its estimate; ``plan_sha256`` hashes the plan as
compile writes it into plan.json (`plan_dict`: groups, slices, buffers, addresses, steps,
estimate), so two compilers' plans can be checked byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import traceback
from pathlib import Path


def plan_all(chip_name: str, grouping: bool, on_no_fit: str, qdir: Path) -> dict:
    import npubuild
    from npubuild.npu import build_program, estimate, gmem_lower_bound, plan_dict
    from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph
    from npubuild.quant.qgraph import QGraph
    from npubuild.targets import load_chip

    chip = load_chip(chip_name)
    graphs = {}
    for path in sorted(qdir.glob("graph_*.qgraph.json"),
                       key=lambda p: int(p.name.split(".")[0].split("_")[1])):
        qgraph = QGraph.load(path)
        start = time.perf_counter()
        layers = layers_from_qgraph(qgraph)
        program = build_program(plan_qgraph(layers, chip, grouping=grouping, on_no_fit=on_no_fit))
        found = estimate(program)
        seconds = time.perf_counter() - start
        plan = json.dumps(plan_dict(program, found), sort_keys=True, default=str)
        graphs[qgraph.name] = {"groups": len(program.npu_groups), "gmem_bytes": found.gmem_bytes,
                               "gmem_lower_bound": gmem_lower_bound(layers.graph),
                               "weight_bytes": layers.graph.weight_bytes, "cycles": found.cycles,
                               "lmem_peak_bytes": found.lmem_peak_bytes, "plan_s": seconds,
                               "plan_sha256": hashlib.sha256(plan.encode()).hexdigest()}
    return {"graphs": graphs, "clock_hz": chip.clock_mhz * 1e6,
            "npubuild": str(Path(npubuild.__file__).parent)}


def main(argv: list[str]) -> int:
    chip, grouping, on_no_fit, qdir = argv
    try:
        result = plan_all(chip, grouping == "true", on_no_fit, Path(qdir))
    except Exception as exc:  # noqa: BLE001 - an older compiler may not know newer layers
        last = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"error": f"{type(exc).__name__}: {exc} ({Path(last.filename).name}:"
                           f"{last.lineno})"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
