"""The vendor's figures beside npubuild's own estimate: one table for report.html, one set of
labelled values for `npubuild diff` (read from report.json's ``vendor`` and ``compile``)."""

from __future__ import annotations

from typing import Any

#: (label, key in report["vendor"]) in the order a reviewer reads them.
VENDOR = (
    ("vendor NPU ops", "npu_ops"), ("vendor CPU ops", "cpu_ops"), ("vendor cycles", "cycles"),
    ("vendor inferences/s", "inferences_per_second"), ("vendor artifact bytes", "artifact_bytes"),
    ("vendor SRAM bytes", "sram_bytes"), ("vendor DRAM bytes", "dram_bytes"),
    ("vendor flash bytes", "off_chip_flash_bytes"),
    ("vendor internal memory bytes", "internal_memory_bytes"),
    ("vendor weight memory bytes", "weight_memory_bytes"),
)
#: npubuild's own estimate of the same chip, for the table beside them.
OWN = (("cycles", "cycles"), ("inferences/s", "npu_fps"), ("GMEM bytes", "gmem_bytes"),
       ("LMEM peak bytes", "lmem_peak_bytes"))


def vendor_figures(report: dict) -> dict[str, Any]:
    """Label → value of the vendor's figures, per quantizer's output cosine too (for diff)."""
    vendor = report.get("vendor") or {}
    out = {label: vendor[key] for label, key in VENDOR if vendor.get(key) is not None}
    toolchain = vendor.get("toolchain") or {}
    if toolchain:
        out["toolchain"] = " ".join(f"{k}=={v}" for k, v in toolchain.items() if k != "toolchain")
    for graph, info in ((report.get("compile") or {}).get("graphs") or {}).items():
        for quantizer, q in (info.get("quantizers") or {}).items():
            for tensor, m in (q.get("proof") or {}).items():
                out[f"{quantizer} quantizer cosine {graph}:{tensor}"] = m.get("cosine")
    return out


def table_rows(report: dict) -> list[tuple[str, Any, Any]]:
    """(figure, the vendor's value, npubuild's estimate) rows for report.html."""
    vendor, own = report.get("vendor") or {}, report.get("estimate") or {}
    rows = [(label.removeprefix("vendor "), vendor.get(key), None) for label, key in VENDOR
            if vendor.get(key) is not None]
    by_label = {label: i for i, (label, _, _) in enumerate(rows)}
    for label, key in OWN:
        if own.get(key) is None:
            continue
        if label in by_label:
            i = by_label[label]
            rows[i] = (rows[i][0], rows[i][1], own[key])
        else:
            rows.append((label, None, own[key]))
    return rows


def quantizer_rows(report: dict) -> list[list[Any]]:
    """Per graph, quantizer and NPU output: the vendor artifact's cosine, SQNR, bytes, ops."""
    rows = []
    for graph, info in ((report.get("compile") or {}).get("graphs") or {}).items():
        for quantizer, q in (info.get("quantizers") or {}).items():
            for tensor, m in (q.get("proof") or {}).items():
                rows.append([graph, quantizer + (" (deployed)" if quantizer == info.get("deployed") else ""),
                             tensor, m.get("cosine"), m.get("sqnr_db"), q.get("artifact_bytes"),
                             q.get("npu_ops"), q.get("cpu_ops")])
    return rows


def handover_lines(report: dict) -> list[str]:
    """Per graph and quantizer: whose quantization the vendor's tensors carry and how the
    vendor's integers agree with npubuild's reference and why they differ where the backend
    measured it (the ``summary`` lines of report.json's ``quantization`` and
    ``integer_reference``, and the latter's ``why``)."""
    lines = []
    for graph, info in ((report.get("compile") or {}).get("graphs") or {}).items():
        for quantizer, q in (info.get("quantizers") or {}).items():
            for key in ("quantization", "integer_reference"):
                entry = q.get(key) or {}
                if entry.get("summary"):
                    why = f" — why: {entry['why']}" if entry.get("why") else ""
                    lines.append(f"{graph}, {quantizer}: {entry['summary']}{why}")
    return lines


def vendor_section(a) -> str:
    """report.html: the vendor's figures beside npubuild's estimate, and the quantizers."""
    from npubuild.report.html import para, table

    report = a.report
    vendor = report.get("vendor")
    if not vendor and not report.get("compile"):
        return a.not_built("compile", "report.json vendor")
    if not vendor:
        return para("simulated chip: npubuild's own compiler and simulator (no vendor toolchain)",
                    "note")
    toolchain = ", ".join(f"{k} {v}" for k, v in (vendor.get("toolchain") or {}).items()
                          if k != "toolchain")
    out = para(f"backend {vendor.get('backend')} ({toolchain}); artifact bytes "
               + ("reproducible" if vendor.get("reproducible") else
                  "not reproducible: keyed on their inputs, checked by re-running the proof "
                  "inputs"), "note")
    out += table(["figure", "vendor", "npubuild estimate"], table_rows(report))
    out += table(["graph", "quantizer", "NPU output", "cosine vs float", "SQNR dB",
                  "artifact bytes", "NPU ops", "CPU ops"], quantizer_rows(report))
    for line in handover_lines(report):
        out += para(line, "note")
    return out
