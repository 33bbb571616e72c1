"""Screenshots of report.html in headless Chromium for docs/ (the README shows them).

    python3 scripts/report_screenshots.py build/yolov8n docs/
    python3 scripts/report_screenshots.py build/ppocr-v4-det docs/ --prefix report-ppocr-det --crops headline,verify,time
    python3 scripts/report_screenshots.py build/transformer-encoder docs/ --prefix report-segments --crops headline,split

Renders the build's page, takes one tall screenshot at 1280 px, asks the page where its
sections are, and crops: the headline and stage table, verify, where the time goes, the split
graph, the quantization charts, and the LMEM timeline (``--crops`` picks some; ``--prefix``
names the files). PNGs with a 256-colour palette keep them small.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from npubuild.report import render_report

WIDTH, HEIGHT = 1280, 16000
PROBE = """<script>
window.addEventListener("load", () => {
  const at = {};
  for (const id of ["stages", "verify", "time", "segments", "coverage", "quantization", "lmem", "estimate"]) {
    const el = document.getElementById(id);
    if (el) { const r = el.getBoundingClientRect(); at[id] = [r.top + scrollY, r.bottom + scrollY]; }
  }
  const quant = document.querySelector("#quantization .gallery");
  if (quant) { const r = quant.getBoundingClientRect(); at["histograms"] = [r.top + scrollY, r.bottom + scrollY]; }
  document.body.dataset.at = JSON.stringify(at);
});
</script>
</body>"""
CROPS = {  # name: (from the top of, to the bottom of)
    "headline": (None, "stages"),
    "verify": ("verify", "verify"),
    "time": ("time", "time"),
    "split": ("segments", "segments"),
    "quantization": ("quantization", "histograms"),
    "lmem": ("lmem", "lmem"),
}
MAX_HEIGHT = 2400  # a crop taller than this is cut (a long section's start tells enough)


def chromium(*args: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        sys.exit("headless Chromium is needed: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                               "--hide-scrollbars", "--no-first-run", f"--user-data-dir={profile}",
                               f"--window-size={WIDTH},{HEIGHT}", *args],
                              capture_output=True, text=True, timeout=120)
    if proc.returncode:
        sys.exit(proc.stderr[-2000:])
    return proc.stdout


def main(build_dir: str, out_dir: str, prefix: str = "report", crops: str = ",".join(CROPS)) -> None:
    out = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        html = render_report(Path(build_dir))
        page.write_text(html.replace("</body>", PROBE))
        dom = chromium("--dump-dom", page.as_uri())
        at = json.loads(re.search(r'data-at="([^"]*)"', dom).group(1).replace("&quot;", '"'))
        page.write_text(html)
        shot = Path(tmp) / "tall.png"
        chromium(f"--screenshot={shot}", page.as_uri())
        tall = Image.open(shot).convert("RGB")
        for crop in crops.split(","):
            first, last = CROPS[crop]
            name = f"{prefix}-{crop}.png"
            if (first and first not in at) or last not in at:
                print(f"{name}: section missing, skipped")
                continue
            top = max(0, int(at[first][0]) - 8) if first else 0
            bottom = min(int(at[last][1]) + 8, tall.height, top + MAX_HEIGHT)
            tall.crop((0, top, WIDTH, bottom)).quantize(colors=256).save(out / name, optimize=True)
            print(f"{out / name}: {bottom - top} px high, {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--prefix", default="report")
    parser.add_argument("--crops", default=",".join(CROPS))
    args = parser.parse_args()
    main(args.build_dir, args.out_dir, args.prefix, args.crops)
