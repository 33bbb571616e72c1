"""Vela in its own environment: an int8 TFLite -> the Ethos-U TFLite and its summary CSV.

Job: tflite (path), accelerator (Vela's --accelerator-config), system_config and memory_mode
(optional), output_dir. Result: the compiled file, the summary CSV and the operator counts
Vela printed.
"""

import contextlib
import glob
import io
import os
import re
import sys

from _protocol import main


def build(spec):
    from ethosu.vela import vela

    args = [spec["tflite"], "--accelerator-config", spec["accelerator"],
            "--output-dir", spec["output_dir"]]
    for key, flag in (("system_config", "--system-config"), ("memory_mode", "--memory-mode")):
        if spec.get(key):
            args += [flag, spec[key]]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = vela.main(args)
    text = printed.getvalue()
    sys.stdout.write(text)
    if code:
        raise RuntimeError(f"vela exited with {code}")
    counts = {kind.lower(): int(n) for kind, n in re.findall(r"(CPU|NPU) operators = (\d+)", text)}
    stem = os.path.splitext(os.path.basename(spec["tflite"]))[0]
    summary = glob.glob(os.path.join(spec["output_dir"], f"{stem}_summary_*.csv"))
    return {"compiled": os.path.join(spec["output_dir"], f"{stem}_vela.tflite"),
            "summary": summary[0] if summary else None,
            "cpu_ops": counts.get("cpu", 0), "npu_ops": counts.get("npu", 0)}


if __name__ == "__main__":
    main(build)
