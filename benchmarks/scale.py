"""Past one machine: calibration and verification fanned out on Dask, and a second machine
restoring a build from a shared S3 remote. Everything is measured in this run; prints three
tables.

1. YOLOv8n-320 calibration over N augmented photos (flips, crops, brightness of skimage's
   photos, written as .npy): the quantize stage in one process, then with
   `--scheduler local:1` and `local:2`; speed-up against the one-process build, and whether
   the quantize artifacts are byte-identical.
2. YOLOv8n-320 verification over the same N photos: the verify stage (simulator + ONNX Runtime
   references per sample) in one process, then with `local:1` and `local:2`, each restoring
   the upstream stages from its own copy of one cache; whether verify.json is byte-identical.
3. Machine A builds recipes/yolov8.yaml with a remote cache on a local S3 server (moto);
   machine B (fresh build dir, empty local cache, same remote) restores every stage.

    python3 benchmarks/scale.py [--samples 400] [--skip-calibration] [--skip-verify] [--skip-remote]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npubuild import api  # noqa: E402


def augmented_photos(out: Path, count: int, size: int = 320) -> None:
    """``count`` preprocessed inputs (1x3xHxW float32 in [0, 1]) from skimage's photos."""
    from PIL import Image

    from npubuild.recipe.paths import resolve_glob

    photos = [p for p in resolve_glob("pkg:skimage/data/*.png", REPO) if p.stat().st_size > 20_000]
    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        image = Image.open(photos[k % len(photos)]).convert("RGB")
        w, h = image.size
        crop = rng.uniform(0.6, 1.0)
        cw, ch = int(w * crop), int(h * crop)
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = image.crop((x0, y0, x0 + cw, y0 + ch)).resize((size, size))
        array = np.asarray(image, dtype=np.float32) / 255.0 * rng.uniform(0.7, 1.3)
        if rng.random() < 0.5:
            array = array[:, ::-1]
        tensor = np.clip(array, 0, 1).transpose(2, 0, 1)[None].astype(np.float32)
        np.save(out / f"sample_{k:05d}.npy", np.ascontiguousarray(tensor))


def recipe_for(tmp: Path, data: Path, samples: int) -> Path:
    text = (REPO / "recipes" / "yolov8.yaml").read_text()
    start = text.index("  calibration:")
    end = text.index("compile:")
    text = (text[:start] + f"  calibration:\n    data: \"{data}/*.npy\"\n    samples: {samples}\n"
            "    method: minmax\n" + text[end:])
    path = tmp / "yolov8-scale.yaml"
    path.write_text(text)
    return path


def digest(root: Path) -> str:
    """Of every artifact (the manifest records build seconds, so it is left out)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def quantize_seconds(recipe: Path, tmp: Path, name: str, scheduler: str | None) -> tuple[float, str]:
    build, cache = tmp / f"build-{name}", tmp / f"cache-{name}"
    api.build(api.session_for(recipe, build_root=build, cache=cache), "split")
    session = api.session_for(recipe, build_root=build, cache=cache, scheduler=scheduler)
    start = time.perf_counter()
    api.build(session, "quantize")
    seconds = time.perf_counter() - start
    return seconds, digest(session.paths.root / "quantize")


def calibration_table(samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        augmented_photos(tmp / "data", samples)
        recipe = recipe_for(tmp, tmp / "data", samples)
        rows = []
        base, base_digest = quantize_seconds(recipe, tmp, "one-process", None)
        rows.append(("one process (no Dask)", base, base_digest))
        for workers in (1, 2):
            seconds, d = quantize_seconds(recipe, tmp, f"dask{workers}", f"local:{workers}")
            rows.append((f"--scheduler local:{workers}", seconds, d))
        print(f"\nquantize stage of YOLOv8n-320, calibration on {samples} augmented photos "
              f"({os.cpu_count()} cores)\n")
        print("| run | seconds | speed-up vs one process | quantize artifacts |")
        print("|---|---|---|---|")
        for label, seconds, d in rows:
            same = "identical" if d == base_digest else "DIFFERENT"
            print(f"| {label} | {seconds:.1f} | {base / seconds:.2f}x | {same} |")


VERIFY_CALIBRATION_SAMPLES = 16  # quantize is built once here; verify is what is measured


def verify_recipe(tmp: Path, data: Path, samples: int) -> Path:
    """The YOLOv8n recipe calibrated on a few of the photos and verified on all of them (the
    per-image detection picture and the task check left out: they judge the model, not the
    fan-out, and draw every image)."""
    text = recipe_for(tmp, data, VERIFY_CALIBRATION_SAMPLES).read_text()
    text = text[:text.index("verify:")] + (f"verify:\n  data: \"{data}/*.npy\"\n  samples: {samples}\n"
                                           "  min_cosine: 0.9\n")
    path = tmp / "yolov8-verify-scale.yaml"
    path.write_text(text)
    return path


def verify_table(samples: int) -> None:
    from npubuild.errors import BuildError

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        augmented_photos(tmp / "data", samples)
        recipe = verify_recipe(tmp, tmp / "data", samples)
        api.build(api.session_for(recipe, build_root=tmp / "upstream", cache=tmp / "cache"),
                  "compile")
        rows = []
        for label, scheduler in (("one process (no Dask)", None),
                                 ("--scheduler local:1", "local:1"),
                                 ("--scheduler local:2", "local:2")):
            name = scheduler or "one-process"
            shutil.copytree(tmp / "cache", tmp / f"cache-{name}")  # restores import..compile
            session = api.session_for(recipe, build_root=tmp / f"build-{name}",
                                      cache=tmp / f"cache-{name}", scheduler=scheduler)
            try:
                api.build(session)
            except BuildError as exc:  # a failed verdict still writes verify.json: compare it
                print(f"# {label}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            verify = session.results["verify"]
            assert verify.status == "built", verify.status
            rows.append((label, verify.seconds, digest(session.paths.root / "verify"),
                         verify.report["accuracy"]["samples"]))
        base, base_digest = rows[0][1], rows[0][2]
        print(f"\nverify stage of YOLOv8n-320 on {rows[0][3]} augmented photos "
              f"({os.cpu_count()} cores)\n")
        print("| run | seconds | speed-up vs one process | verify artifacts |")
        print("|---|---|---|---|")
        for label, seconds, d, _ in rows:
            same = "identical" if d == base_digest else "DIFFERENT"
            print(f"| {label} | {seconds:.1f} | {base / seconds:.2f}x | {same} |")


def remote_table() -> None:
    import s3fs
    from moto.server import ThreadedMotoServer

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"})
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("npubuild-bench")
    url = "s3://npubuild-bench/cache"
    recipe = REPO / "recipes" / "yolov8.yaml"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            from npubuild.engine.signing import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, generate_key_pair

            public = generate_key_pair(tmp / "writer.key")  # A signs; B trusts A's public key
            keys = {"A": {SIGNING_KEY_ENV: str(tmp / "writer.key")}, "B": {TRUSTED_KEYS_ENV: public}}
            rows = []
            for machine in ("A (builds, pushes)", "B (restores from the remote)"):
                tag = machine[0]
                for name in (SIGNING_KEY_ENV, TRUSTED_KEYS_ENV):
                    os.environ.pop(name, None)
                os.environ.update(keys[tag])
                session = api.session_for(recipe, build_root=tmp / tag, cache=tmp / f"cache-{tag}",
                                          remote=url)
                start = time.perf_counter()
                api.build(session)
                seconds = time.perf_counter() - start
                statuses = sorted({r.status for r in session.results.values()})
                rows.append((machine, seconds, ", ".join(statuses), digest(session.paths.root / "compile")))
            print("\nrecipes/yolov8.yaml, remote cache on a local S3 server (moto), two machines\n")
            print("| machine | seconds | stages | compile artifacts |")
            print("|---|---|---|---|")
            for machine, seconds, statuses, d in rows:
                same = "identical" if d == rows[0][3] else "DIFFERENT"
                print(f"| {machine} | {seconds:.1f} | {statuses} | {same} |")
            print(f"\nB / A time: {rows[1][1] / rows[0][1]:.2f}")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--skip-calibration", action="store_true")
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-remote", action="store_true")
    args = parser.parse_args()
    if not args.skip_calibration:
        calibration_table(args.samples)
    if not args.skip_verify:
        verify_table(args.samples)
    if not args.skip_remote:
        remote_table()


if __name__ == "__main__":
    main()
