"""Small HTML builders for the report: every text goes through `esc`, every number through `fmt`.

Hand-written on purpose (no template engine): a table is a list of rows, a long table shows its
first ``limit`` rows and says how many it hides, a long list folds into ``<details>``.
"""

from __future__ import annotations

import base64
import json
import math
from html import escape
from typing import Any, Iterable, Sequence

TABLE_LIMIT = 200
CELL_CHARS = 160


def esc(value: Any) -> str:
    return escape(str(value), quote=True)


class Raw(str):
    """HTML that is already built (a link, a badge): tables put it in as is."""


def fmt(value: Any, digits: int = 4) -> str:
    """A value as short text: ``—`` for missing, thousands separators, 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:,.{max(digits - 2, 1)}f}"
        return f"{value:.{digits - 1}e}"
    if isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, separators=(", ", ": "), default=str)
        return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"
    return str(value)


def cell(value: Any, cls: str = "") -> str:
    body = value if isinstance(value, Raw) else esc(fmt(value))
    return f'<td class="{cls}">{body}</td>' if cls else f"<td>{body}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, limit: int = TABLE_LIMIT,
          classes: Iterable[Sequence[str]] | None = None, hidden_note: str = "") -> str:
    """A table of at most ``limit`` rows, then a note with the count of rows not shown."""
    rows = list(rows)
    classes = list(classes) if classes is not None else [()] * len(rows)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row, row_classes in zip(rows[:limit], classes[:limit]):
        cls = list(row_classes) + [""] * (len(row) - len(row_classes))
        body.append("<tr>" + "".join(cell(v, c) for v, c in zip(row, cls)) + "</tr>")
    out = (f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
           "</tbody></table></div>")  # a table wider than the page scrolls, the page does not
    if len(rows) > limit:
        where = f" ({hidden_note})" if hidden_note else ""
        out += f'<p class="hidden-note">{len(rows) - limit:,} more rows not shown{esc(where)}</p>'
    return out


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column key/value table."""
    rows = "".join(f"<tr><th>{esc(k)}</th>{cell(v)}</tr>" for k, v in pairs)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def records(items: Sequence[dict], *, limit: int = TABLE_LIMIT) -> str:
    """Any list of flat-ish dicts as a table, columns in order of first appearance."""
    columns: list[str] = []
    for item in items:
        columns += [k for k in item if k not in columns]
    return table(columns, ([item.get(c) for c in columns] for item in items), limit=limit)


def details(summary: str, body: str, *, open_: bool = False) -> str:
    flag = " open" if open_ else ""
    return f"<details{flag}><summary>{esc(summary)}</summary>{body}</details>"


def para(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>"


def pre_json(data: Any) -> str:
    return f"<pre>{esc(json.dumps(data, indent=2, default=str))}</pre>"


def badge(text: str, kind: str) -> Raw:
    return Raw(f'<span class="badge {esc(kind)}">{esc(text)}</span>')


def code(text: str) -> Raw:
    return Raw(f"<code>{esc(text)}</code>")


def image(data: bytes, mime: str, alt: str) -> str:
    """An image inlined as a data: URI, so the page needs no file beside it."""
    uri = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return f'<img src="{uri}" alt="{esc(alt)}">'


def scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def generic(value: Any, depth: int = 0) -> str:
    """Any JSON value as tables: for fields the report does not know yet (forward compatible)."""
    if scalar(value):
        return para(fmt(value))
    if isinstance(value, list) and all(isinstance(v, dict) for v in value) and value:
        return records(value)
    if isinstance(value, list):
        return f"<ul>{''.join(f'<li>{esc(fmt(v))}</li>' for v in value)}</ul>"
    if depth >= 3:
        return pre_json(value)
    flat = [(k, v) for k, v in value.items() if _flat(v)]
    nested = [(k, v) for k, v in value.items() if not _flat(v)]
    out = kv_table(flat) if flat else ""
    for key, sub in nested:
        out += f"<h4>{esc(key)}</h4>" + generic(sub, depth + 1)
    return out


def _flat(value: Any) -> bool:
    return scalar(value) or (isinstance(value, list) and all(scalar(x) for x in value))
