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
    return "\n".join(lines) + "\n"


def _chip_text(chip: dict) -> list[str]:
    head = f"figures on {chip['chip']} (a: {chip['a']}, b: {chip['b']})"
    rows = chip["figures"]
    if not rows:
        return [f"{head}: none to compare; {HOW_TO_FILL}"]
    width = max(len(r["figure"]) for r in rows)
    out = [f"{head}:"]
    for r in rows:
        change = delta(r["a"], r["b"])
        out.append(f"  {r['figure']:<{width}}  {value(r['a'], r['figure'])} -> "
                   f"{value(r['b'], r['figure'])}"
                   + (f"  ({change})" if change else ""))
    return out


def markdown(result: dict) -> str:
    """A pull-request comment: changes table, stages to rebuild, figures per chip."""
    out = [f"### npubuild diff: `{result['a']}` → `{result['b']}`", ""]
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
    head = f"**Figures on {chip['chip']}** (before: {chip['a']}, after: {chip['b']})"
    if not chip["figures"]:
        return [f"{head}: none to compare; {HOW_TO_FILL}."]
    out = [head, "", "| figure | before | after | change |", "|---|--:|--:|--:|"]
    for r in chip["figures"]:
        figure = r["figure"]
        out.append(f"| {_cell(figure)} | {value(r['a'], figure)} | {value(r['b'], figure)} | "
                   f"{delta(r['a'], r['b'])} |")
    return out


def value(v: Any, figure: str = "") -> str:
    """A figure as text: shares in percent, cosines with 6 decimals, counts with separators."""
    if figure.startswith("NPU share") and isinstance(v, float):
        return f"{v * 100:.2f} %"
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6f}" if abs(v) <= 1 else f"{v:,.2f}"
    return str(v)


def delta(a: Any, b: Any) -> str:
    """``+0.000123`` for a share or cosine, ``-12.3 %`` for a count or rate; empty when the
    figure is missing on a side, not a number, or the same."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numeric or a == b:
        return ""
    if abs(a) <= 1 and abs(b) <= 1 and isinstance(a, float):
        return f"{b - a:+.6f}"
    return f"{(b - a) / a * 100:+.1f} %" if a else f"{b - a:+,}"


def _change(data: dict) -> Change:
    return Change(data["path"], data["kind"], data.get("old"), data.get("new"), data.get("to"))


def _code(v: Any) -> str:
    return f"`{_cell(show(v))}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")
