"""``report.html``: one self-contained page a reviewer reads to accept or reject a deployment.

`render_report` reads a build directory's artifacts and returns the page; `write_report` writes
it atomically (the verify stage calls it for ``build/<name>/verify/report.html``). Every section
degrades to "not built" when its stage's files are missing.
"""

from npubuild.report.page import SECTIONS, render_report, write_report

__all__ = ["SECTIONS", "render_report", "write_report"]
