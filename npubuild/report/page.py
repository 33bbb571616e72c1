"""The page: sections in reading order, one ``<style>`` block, no script and no network.

A section that cannot be drawn (an artifact in an unexpected shape) shows why in place of its
content; the rest of the page still renders, so a report never hides a whole build.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from string import Template
from typing import Callable

from npubuild.atomic import write_text
from npubuild.backends.figures import vendor_section
from npubuild.report import graph, numbers, overview, timing
from npubuild.report.artifacts import BuildArtifacts, UnreadableArtifact
from npubuild.report.headline import headline
from npubuild.report.html import esc, fmt

log = logging.getLogger("npubuild")

SECTIONS: tuple[tuple[str, str, Callable[[BuildArtifacts], str]], ...] = (
    ("stages", "Stages", overview.stages_section),
    ("verify", "Verify: deployed pipeline vs float", overview.verify_section),
    ("time", "Where the time goes", timing.time_section),
    ("segments", "Split: segments and the tensors between them", graph.segments_section),
    ("coverage", "Op coverage", graph.coverage_section),
    ("quantization", "Quantization per layer", numbers.quantization_section),
    ("lmem", "Layer groups and LMEM", numbers.lmem_section),
    ("estimate", "Performance estimate", numbers.estimate_section),
    ("vendor", "Vendor toolchain: its figures beside npubuild's estimate", vendor_section),
    ("model", "Model and rewrites", graph.model_section),
    ("recipe", "Recipe and lock hashes", overview.recipe_section),
)

# What an artifact in an unexpected shape raises while a section reads it.
SECTION_ERRORS = (UnreadableArtifact, KeyError, TypeError, ValueError, AttributeError,
                  IndexError, StopIteration, OSError)

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       margin: 0 auto; max-width: 1240px; padding: 0 24px 48px; }
header { border-bottom: 2px solid #d0d7de; margin-bottom: 8px; padding-bottom: 6px; }
h1 { font-size: 22px; margin: 18px 0 2px; } h2 { font-size: 18px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; } h4 { font-size: 13px; margin: 10px 0 4px; }
p.facts { margin: 0 0 10px; color: #57606a; font-size: 13px; }
nav { font-size: 13px; margin-top: 8px; } nav a { margin-right: 12px; white-space: nowrap; }
section { border-top: 1px solid #e4e4e4; padding: 14px 0; }
.headline { display: grid; gap: 10px;
            grid-template-columns: minmax(170px, 1.15fr) minmax(330px, 2.5fr) minmax(170px, 1.2fr)
              repeat(3, minmax(120px, .9fr)); }
.tile { border: 1px solid #d0d7de; border-radius: 8px; padding: 8px 12px; background: #f6f8fa;
        min-width: 0; }
table.mini { margin: 0; font-size: 12px; } table.mini td, table.mini th { border: 0;
  padding: 0 8px 0 0; font-weight: normal; background: none; position: static; }
table.mini th { color: #6e7781; } table.mini code { font-size: 11.5px; }
table.mini tr.bad td { color: #c62828; font-weight: 600; }
table.mini tr.good td { color: #1b5e20; }
table.mini tr.reported td { color: #6e7781; font-style: italic; }
table.mini tr.reported-head th { color: #6e7781; font-size: 11px; padding-top: 4px;
  text-transform: uppercase; letter-spacing: .03em; }
table.mini a { color: inherit; text-decoration: none; }
.tile-sub { display: block; font-size: 11.5px; font-weight: 400; color: #57606a;
  overflow-wrap: anywhere; }
td.cell-good, span.cell-good { background: #e3f4e1; } td.cell-bad, span.cell-bad { background: #fde2e1;
  font-weight: 600; } td.cell-reported, span.cell-reported { color: #57606a; font-style: italic; }
td small { color: #57606a; white-space: nowrap; }
p.summary { font-weight: 600; }
table.time td.num { text-align: right; white-space: nowrap; }
table.time td.barcell { width: 220px; min-width: 120px; }
.bar { height: 10px; border-radius: 2px; min-width: 1px; }
.bar.npu { background: #2e7d32; } .bar.cpu { background: #8c959f; } .bar { background: #bbb; } .legend span { padding: 0 4px; }
.tile-title { font-size: 12px; color: #57606a; text-transform: uppercase; letter-spacing: .03em; }
.tile-value { font-size: 22px; font-weight: 650; margin: 2px 0; font-variant-numeric: tabular-nums; }
.tile-detail { font-size: 12px; color: #424a53; font-variant-numeric: tabular-nums; }
.tile-detail div { overflow-wrap: anywhere; }
.tile-detail .bad { color: #c62828; font-weight: 600; } .muted { color: #6e7781; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top;
         max-width: 520px; overflow-wrap: break-word; }
th { white-space: nowrap; }
thead th { background: #f3f3f3; position: sticky; top: 0; }
table.kv th { background: #f8f8f8; font-weight: 600; white-space: nowrap; }
td.bad { background: #fde2e1; } td.warn { background: #fff1cc; } td.ok { background: #e3f4e1; }
td.low { color: #7a4b00; font-style: italic; } td.lower { color: #7a4b00; font-style: italic;
  font-weight: 700; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; background: #eee; color: #444; }
.badge.pass, .badge.ok { background: #2e7d32; color: white; }
.badge.fail, .badge.bad { background: #c62828; color: white; }
.badge.big { font-size: 20px; padding: 2px 16px; }
.not-built { color: #777; font-style: italic; }
.note, .hidden-note { color: #666; font-size: 12px; }
.warn { color: #8a5a00; } p.ok { color: #2e7d32; } .error { color: #c62828; }
details { margin: 6px 0; } summary { cursor: pointer; color: #1a4f8b; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; max-height: 480px; font-size: 12px; }
code.hash { font-size: 12px; } figure { margin: 8px 0; } img { max-width: 100%; height: auto; }
figcaption { color: #666; font-size: 12px; }
svg.chart { display: block; max-width: 100%; height: auto; font: 12px system-ui, sans-serif; }
svg.chart.natural { max-width: none; }
.graphbox { overflow: auto; max-height: 80vh; border: 1px solid #eaeef2; }
div.wide { max-width: 100%; overflow-x: auto; }
svg.chart text { fill: #1f2328; } svg.chart .axis { stroke: #8c959f; }
svg.chart rect:hover, svg.chart path.hover:hover { stroke: #111; stroke-width: 1.5; }
.gallery { display: flex; flex-wrap: wrap; gap: 12px; }
.gallery figure { flex: 0 1 372px; margin: 0; }
"""

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>$css</style>
</head>
<body>
<header>
<h1>$title</h1>
$facts
$headline
<nav>$nav</nav>
</header>
$sections
<footer><p class="note">Written by npubuild from the artifacts in $build_dir/; every picture is
inlined, so this file can be mailed or attached on its own.</p></footer>
</body>
</html>
""")


def render_report(build_dir: Path, *, stage_dirs: dict[str, Path] | None = None) -> str:
    """The report page for one build directory (reads its artifacts; writes nothing).

    ``stage_dirs`` reads a stage's files from elsewhere, e.g. ``{"verify": ctx.out}`` when the
    verify stage renders the page before its directory is swapped into the build.
    """
    a = BuildArtifacts(Path(build_dir), {k: Path(v) for k, v in (stage_dirs or {}).items()})
    name = a.recipe.get("name") or Path(build_dir).name
    verdict = _guarded(lambda: overview.verdict(a), ("none", "no verdict: verify.json unreadable"))
    facts = _guarded(lambda: facts_line(overview.header_facts(a)), "")
    top = _guarded(lambda: headline(a, verdict), "")
    return PAGE.substitute(
        title=esc(f"npubuild report: {name}"), css=CSS, headline=top, facts=facts,
        nav="\n".join(f'<a href="#{key}">{esc(title)}</a>' for key, title, _ in SECTIONS),
        sections="\n".join(_section(a, *entry) for entry in SECTIONS),
        build_dir=esc(Path(build_dir).name))


def facts_line(facts: list) -> str:
    """recipe · model · target · npubuild on one line under the title."""
    return '<p class="facts">' + " · ".join(
        f"{esc(k)} <code>{esc(fmt(v))}</code>" for k, v in facts if v is not None) + "</p>"


def write_report(build_dir: Path, out: Path, *,
                 stage_dirs: dict[str, Path] | None = None) -> Path:
    """Render the report of ``build_dir`` and write it to ``out`` atomically."""
    path = write_text(out, render_report(build_dir, stage_dirs=stage_dirs))
    os.chmod(path, 0o644)  # a temp file is created 0600; a report is for reading
    return path


def _section(a: BuildArtifacts, key: str, title: str,
             render: Callable[[BuildArtifacts], str]) -> str:
    try:
        body = render(a)
    except SECTION_ERRORS as exc:
        log.warning("report section %r could not be drawn: %s: %s", title, type(exc).__name__, exc)
        body = (f'<p class="error">could not draw this section from the artifacts: '
                f"{esc(type(exc).__name__)}: {esc(exc)}</p>")
    return f'<section id="{key}">\n<h2>{esc(title)}</h2>\n{body}\n</section>'


def _guarded(make: Callable, fallback):
    try:
        return make()
    except SECTION_ERRORS:
        return fallback
