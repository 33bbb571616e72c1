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
from npubuild.report import graph, numbers, overview
from npubuild.report.artifacts import BuildArtifacts, UnreadableArtifact
from npubuild.report.html import badge, esc, kv_table

log = logging.getLogger("npubuild")

SECTIONS: tuple[tuple[str, str, Callable[[BuildArtifacts], str]], ...] = (
    ("verify", "Verdict and verify metrics", overview.verify_section),
    ("recipe", "Recipe and lock hashes", overview.recipe_section),
    ("stages", "Stages", overview.stages_section),
    ("model", "Model and rewrites", graph.model_section),
    ("coverage", "Op coverage", graph.coverage_section),
    ("segments", "Segments", graph.segments_section),
    ("quantization", "Quantization per layer", numbers.quantization_section),
    ("lmem", "Layer groups and LMEM timelines", numbers.lmem_section),
    ("estimate", "Performance estimate", numbers.estimate_section),
)

# What an artifact in an unexpected shape raises while a section reads it.
SECTION_ERRORS = (UnreadableArtifact, KeyError, TypeError, ValueError, AttributeError,
                  IndexError, StopIteration, OSError)

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 0 auto; max-width: 1200px;
       padding: 0 24px 48px; }
header { border-bottom: 2px solid #ddd; margin-bottom: 8px; }
h1 { font-size: 24px; margin: 20px 0 6px; } h2 { font-size: 19px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; } h4 { font-size: 13px; margin: 10px 0 4px; }
nav a { margin-right: 12px; white-space: nowrap; }
section { border-top: 1px solid #e4e4e4; padding: 14px 0; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top;
         max-width: 520px; overflow-wrap: break-word; }
th { white-space: nowrap; }
thead th { background: #f3f3f3; position: sticky; top: 0; }
table.kv th { background: #f8f8f8; font-weight: 600; white-space: nowrap; }
td.bad { background: #fde2e1; } td.warn { background: #fff1cc; } td.ok { background: #e3f4e1; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; background: #eee; color: #444; }
.badge.pass, .badge.ok { background: #2e7d32; color: white; }
.badge.fail, .badge.bad { background: #c62828; color: white; }
.verdict .badge { font-size: 18px; padding: 4px 16px; }
.not-built { color: #777; font-style: italic; }
.note, .hidden-note { color: #666; font-size: 12px; }
.warn { color: #8a5a00; } p.ok { color: #2e7d32; } .error { color: #c62828; }
details { margin: 6px 0; } summary { cursor: pointer; color: #1a4f8b; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; max-height: 480px; font-size: 12px; }
code.hash { font-size: 12px; } figure { margin: 8px 0; } img { max-width: 100%; height: auto; }
figcaption { color: #666; font-size: 12px; }
figure.wide { overflow-x: auto; } figure.wide img { max-width: none; }
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
<h1>$title $verdict</h1>
$facts
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
    kind, text = _guarded(lambda: overview.verdict(a),
                          ("none", "no verdict: verify.json unreadable"))
    facts = _guarded(lambda: kv_table(overview.header_facts(a)), "")
    return PAGE.substitute(
        title=esc(f"npubuild report: {name}"), css=CSS, verdict=badge(text, kind), facts=facts,
        nav="\n".join(f'<a href="#{key}">{esc(title)}</a>' for key, title, _ in SECTIONS),
        sections="\n".join(_section(a, *entry) for entry in SECTIONS),
        build_dir=esc(Path(build_dir).name))


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
