"""`npubuild diff` as text (a terminal) or Markdown (a pull-request comment). Both say every
changed field in full; a chip without figures says why instead of showing an empty table."""

from __future__ import annotations

from typing import Any

from npubuild.diff.changes import Change, show

HOW_TO_FILL = ("build both versions once (`npubuild run`), or point --cache at the cache CI "
               "fills, to compare their figures")


def text(result: dict) -> str:
    lines = [f"a: {result['a']}", f"b: {result['b']}", ""]
    found = [_change(c) for c in result["changes"]]
    lines.append(f"recipe changes ({len(found)}):" if found else "recipe changes: none")
    lines += [f"  {c.line()}" for c in found]
    lines += ["", "stages:"]
    for stage in result["stages"]:
        lines.append(f"  {stage['stage']:<9} {'same' if stage['same'] else 'differs'}")
        lines += [f"            {reason}" for reason in stage["reasons"]]
    for chip in result["chips"]:
        lines += ["", *_chip_text(chip)]
    lines += ["", regressions_line(result)]
    return "\n".join(lines) + "\n"


def pair_title(chip: dict) -> str:
    """``npu-16m``, or ``npu-16m -> npu-tiny`` when the chip changed."""
    a, b = chip["chips"]["a"], chip["chips"]["b"]
    return a if a == b else f"{a or '(none)'} -> {b or '(none)'}"


def regressions_line(result: dict) -> str:
    found = result["regressions"]
    if not found:
        return "no regression against a threshold"
    return (f"{len(found)} regression{'s' * (len(found) > 1)} against thresholds: "
            + "; ".join(f"{r['label']} ({pair_title(r)})" for r in found))


def _chip_text(chip: dict) -> list[str]:
    state = chip["state"]
    head = f"figures on {pair_title(chip)} (a: {state['a']}, b: {state['b']})"
    rows = chip["figures"]
    if not rows:
        return [f"{head}: none to compare; {HOW_TO_FILL}"]
    table = [["figure", "a", "b", "change", "threshold", ""]]
    for r in rows:
        table.append([r["label"], _side(r, "a"), _side(r, "b"), change_text(r), threshold(r),
                      _note(r)])
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    out = [f"{head}:"]
    for row in table:
        cells = [row[0].ljust(widths[0]), *(row[i].rjust(widths[i]) for i in (1, 2, 3)),
                 row[4].ljust(widths[4]), row[5]]
        out.append(("  " + "  ".join(cells)).rstrip())
    for side in ("a", "b"):
        if chip["failures"][side]:
            out.append(f"  {side} fails verify:")
            out += [f"    {line}" for line in chip["failures"][side]]
    return out


def _side(row: dict, side: str) -> str:
    """A value, with ✗ when it misses its threshold."""
    mark = " ✗" if row["ok"][side] is False else ""
    return value(row[side], row["key"]) + mark


def threshold(row: dict) -> str:
    if row["limit"] is None:  # a verify figure no threshold judges, or (fps, GMEM) no verdict
        judgeable = row["key"].startswith(("accuracy.", "verify.")) and row["key"] != "verify.passed"
        return "reported only" if judgeable else ""
    sign = "≥" if row["direction"] == "min" else "≤"
    return f"{sign} {row['limit']!r}"


def _note(row: dict) -> str:
    notes = []
    if row["regression"]:
        notes.append("REGRESSION")
    if row["fixed"]:
        notes.append("fixed")
    evidence = row.get("evidence") or {}
    shown = evidence.get("b") or evidence.get("a")
    if shown:
        notes.append(shown)
    return "; ".join(notes)


def markdown(result: dict) -> str:
    """A pull-request comment: regressions first, changes table, stages to rebuild, figures per
    chip pair."""
    out = [f"### npubuild diff: `{result['a']}` → `{result['b']}`", ""]
    found = result["regressions"]
    out.append(f"**{len(found)} regression{'s' * (len(found) > 1)} against thresholds**: "
               + "; ".join(f"{_cell(r['label'])} ({_cell(pair_title(r))})" for r in found)
               if found else "No regression against a threshold.")
    out.append("")
    found = [_change(c) for c in result["changes"]]
    if found:
        out += ["| recipe field | change | before | after |", "|---|---|---|---|"]
        for c in found:
            before = "" if c.kind == "added" else _code(c.old)
            after = ("" if c.kind == "removed" else
                     f"moved to `{c.to}`" if c.kind == "moved" else _code(c.new))
            out.append(f"| `{c.path}` | {c.kind} | {before} | {after} |")
    else:
        out.append("The recipes are the same field for field.")
    rebuilt = [s["stage"] for s in result["stages"] if not s["same"]]
    same = [s["stage"] for s in result["stages"] if s["same"]]
    out += ["", f"**Stages that build differently:** {', '.join(rebuilt) or 'none'}"
            + (f" (unchanged: {', '.join(same)})" if same else "")]
    if rebuilt:
        out += ["", "<details><summary>why each stage differs</summary>", ""]
        for s in result["stages"]:
            if not s["same"]:
                out += [f"- **{s['stage']}**"] + [f"  - {r}" for r in s["reasons"]]
        out += ["", "</details>"]
    for chip in result["chips"]:
        out += ["", *_chip_markdown(chip)]
    return "\n".join(out) + "\n"


def _chip_markdown(chip: dict) -> list[str]:
    state = chip["state"]
    head = f"**Figures on {_cell(pair_title(chip))}** (before: {state['a']}, after: {state['b']})"
    if not chip["figures"]:
        return [f"{head}: none to compare; {HOW_TO_FILL}."]
    out = [head, "", "| figure | before | after | change | threshold | |",
           "|---|--:|--:|--:|---|---|"]
    for r in chip["figures"]:
        row = [_cell(r["label"]), _md_side(r, "a"), _md_side(r, "b"), change_text(r),
               _cell(threshold(r)), _cell(_note(r))]
        if r["regression"]:
            row = [f"**{c}**" if c else c for c in row]
        out.append("| " + " | ".join(row) + " |")
    for side, word in (("b", "after"), ("a", "before")):
        if chip["failures"][side]:
            out += ["", f"The {word} version fails verify:", ""]
            out += [f"- {_cell(line)}" for line in chip["failures"][side]]
    return out


def _md_side(row: dict, side: str) -> str:
    mark = " ❌" if row["ok"][side] is False else ""
    return _cell(value(row[side], row["key"])) + mark


def value(v: Any, key: str = "") -> str:
    """A figure as text: shares in percent, cosines with 6 decimals, counts with separators,
    the verdict as pass/FAIL."""
    if key.startswith("split.npu_share") and isinstance(v, float):
        return f"{v * 100:.2f} %"
    if v is None:
        return "—"
    if key == "verify.passed":
        return "pass" if v else "FAIL"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6f}" if abs(v) <= 1 else f"{v:,.2f}"
    return str(v)


def change_text(row: dict) -> str:
    """``+0.000123`` for a share or cosine, ``-12.3 %`` for a count or rate; empty when a side
    is missing, not a number, or the same."""
    a, b, moved = row["a"], row["b"], row["change"]
    if moved is None or a == b:
        return ""
    if abs(a) <= 1 and abs(b) <= 1 and isinstance(a, float):
        return f"{moved['delta']:+.6f}"
    if moved["relative"] is None:
        return f"{moved['delta']:+,}"
    return f"{moved['relative'] * 100:+.1f} %"


def _change(data: dict) -> Change:
    return Change(data["path"], data["kind"], data.get("old"), data.get("new"), data.get("to"))


def _code(v: Any) -> str:
    return f"`{_cell(show(v))}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")
