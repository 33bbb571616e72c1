"""Attack the shared remote cache as anyone with write access to its storage could, and measure
what a victim machine's `npubuild run` does about each attack.

Machine A (the writer, holding the signing key) builds the tiny recipe through verify and
pushes it. Each attack then spoils one entry of a copy of that remote (``file://``), or of an
S3 bucket (moto's S3 server on 127.0.0.1, the real s3fs client), or makes the remote freeze;
a victim machine with a fresh build directory and local cache runs the stage, in its own
process, and a third machine checks whether the victim's push healed the entry.

    python3 benchmarks/remote_attacks.py [--oversize-mib 1024] [--timeout 10]

Columns: accepted (the victim restored the spoilt entry), crashed (a non-zero exit, a
traceback or an "internal error"), peak RSS of the victim process (MB), its wall seconds (and
against a local build without a remote), warnings naming the remote, whether the victim's push
healed the entry, and whether a credential from the URL appears in its output. Exits 1 when any
attack is accepted or crashes a run, a peak RSS reaches 300 MB, or a remote failure costs more
than 60 s over a local build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"
MAX_RSS_MB, MAX_EXTRA_SECONDS = 300, 60
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYBENCHSECRET"


@dataclass
class Context:
    """What an attack may use: the trusted writer's key (a writer's mistake is signed) and a
    scratch folder outside the remote."""

    writer_key: Path
    scratch: Path
    oversize: int = 1 << 30


# -- attacks on one entry folder of a file:// remote ------------------------------------------
def resign(entry: Path, key: str, manifest: dict, key_file: Path) -> None:
    """Rewrite the manifest and sign it with ``key_file``."""
    from npubuild.engine.signing import SIGNING_KEY_ENV, load_trust

    raw = json.dumps(manifest, sort_keys=True).encode()
    (entry / MANIFEST).write_bytes(raw)
    (entry / SIGNATURE).write_bytes(load_trust(environ={SIGNING_KEY_ENV: str(key_file)})
                                    .sign(key, raw))


def tampered_artifact_with_fixed_manifest_hash(entry: Path, key: str, ctx: Context) -> None:
    """Other weights in model.onnx, the manifest's hash and size fixed to match."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(entry / "model.onnx")
    init = model.graph.initializer[0]
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    data = model.SerializeToString()
    (entry / "model.onnx").write_bytes(data)
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["model.onnx"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data)}
    (entry / MANIFEST).write_text(json.dumps(manifest))


def flipped_verdict(entry: Path, key: str, ctx: Context) -> None:
    """verify's recorded verdict turned around in the manifest's report."""
    manifest = json.loads((entry / MANIFEST).read_text())
    report = manifest["report"].get("verify") or manifest["report"].setdefault("verify", {})
    report["passed"] = not report.get("passed", True)
    (entry / MANIFEST).write_text(json.dumps(manifest))


def corrupt_entry(entry: Path, key: str, ctx: Context) -> None:
    """One byte of model.onnx flipped (same size, manifest untouched)."""
    data = bytearray((entry / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "model.onnx").write_bytes(bytes(data))


def over_long_name(entry: Path, key: str, ctx: Context) -> None:
    """A trusted writer's bug: a signed manifest listing a 300-character file name."""
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["x" * 300] = {"sha256": "0" * 64, "bytes": 1}
    resign(entry, key, manifest, ctx.writer_key)


def oversized_object(entry: Path, key: str, ctx: Context) -> None:
    """import.json (489 bytes) replaced by a sparse 1 GiB file."""
    with open(entry / "import.json", "r+b") as fh:
        fh.truncate(ctx.oversize)


def oversized_manifest(entry: Path, key: str, ctx: Context) -> None:
    """The manifest itself grown to 1 GiB (sparse)."""
    with open(entry / MANIFEST, "r+b") as fh:
        fh.truncate(ctx.oversize)


def missing_signature(entry: Path, key: str, ctx: Context) -> None:
    """manifest.sig deleted (an entry as an older npubuild, or anyone, would write it)."""
    (entry / SIGNATURE).unlink()


def untrusted_signer(entry: Path, key: str, ctx: Context) -> None:
    """A valid signature, by a key nobody listed in trusted_keys."""
    from npubuild.engine.signing import generate_key_pair

    stranger = ctx.scratch / f"stranger-{uuid.uuid4().hex[:6]}.key"
    generate_key_pair(stranger)
    resign(entry, key, json.loads((entry / MANIFEST).read_text()), stranger)


def manifest_symlink_to_dev_zero(entry: Path, key: str, ctx: Context) -> None:
    """manifest.json a symlink to /dev/zero (an endless read, if followed)."""
    (entry / MANIFEST).unlink()
    (entry / MANIFEST).symlink_to("/dev/zero")


def fifo_listed_as_a_file(entry: Path, key: str, ctx: Context) -> None:
    """model.onnx a FIFO nobody writes to (a read that never returns, if opened blocking)."""
    (entry / "model.onnx").unlink()
    os.mkfifo(entry / "model.onnx")


def symlink_out_of_the_entry(entry: Path, key: str, ctx: Context) -> None:
    """model.onnx a symlink to a copy of itself outside the remote."""
    outside = ctx.scratch / f"outside-{uuid.uuid4().hex[:6]}.onnx"
    (entry / "model.onnx").rename(outside)
    (entry / "model.onnx").symlink_to(outside)


# name -> (attack, the stage whose entry it spoils, the stage the victim builds up to)
FILE_ATTACKS = {
    "tampered artifact, manifest hash fixed": (tampered_artifact_with_fixed_manifest_hash, "import", "import"),
    "flipped verify verdict": (flipped_verdict, "verify", "verify"),
    "corrupt entry (byte flip)": (corrupt_entry, "import", "import"),
    "over-long file name (signed)": (over_long_name, "import", "surgery"),
    "oversized object (1 GiB for 489 B)": (oversized_object, "import", "import"),
    "oversized manifest (1 GiB)": (oversized_manifest, "import", "import"),
    "missing signature": (missing_signature, "import", "import"),
    "signed by an untrusted key": (untrusted_signer, "import", "import"),
    "manifest symlink to /dev/zero": (manifest_symlink_to_dev_zero, "import", "import"),
    "FIFO listed as a file": (fifo_listed_as_a_file, "import", "import"),
    "listed file symlinked out of the entry": (symlink_out_of_the_entry, "import", "import"),
}


# -- running a machine -------------------------------------------------------------------------
@dataclass
class Run:
    code: int
    seconds: float
    rss_mb: float
    stdout: str
    stderr: str
    report: dict = field(default_factory=dict)


def npubuild(args: list[str], cwd: Path, env: dict) -> Run:
    """One `npubuild` process; its own peak RSS (wait4) and wall time."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "npubuild", *args], cwd=cwd, stdout=out,
                                stderr=err, env={**os.environ, "PYTHONPATH": str(REPO), **env})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        run = Run(proc.returncode, seconds, usage.ru_maxrss / 1024, out.read(), err.read())
    try:
        run.report = json.loads(run.stdout)
    except ValueError:
        pass
    return run


def build(machine: str, recipe: Path, stage: str, remote: str | None, env: dict,
          work: Path) -> Run:
    args = ["run", str(recipe), stage, "--build-dir", str(work / machine / "build"), "--cache",
            str(work / machine / "cache"), "--json"]
    return npubuild(args + (["--remote", remote] if remote else []), work, env)


def status(run: Run, stage: str) -> str:
    return ((run.report.get("stages") or {}).get(stage) or {}).get("status", "-")


@dataclass
class Row:
    attack: str
    accepted: bool
    crashed: bool
    rss_mb: float
    seconds: float
    warnings: int
    healed: str = "-"
    secret_shown: str = "-"
    note: str = ""


def judge(name: str, victim: Run, spoilt: str, checker: Run | None, note: str = "") -> Row:
    crashed = (victim.code != 0 or "Traceback" in victim.stderr
               or "internal error" in victim.stderr)
    warnings = sum("remote cache" in line for line in victim.stderr.splitlines())
    healed = "-" if checker is None else ("yes" if status(checker, spoilt) == "restored" else "no")
    return Row(name, status(victim, spoilt) == "restored", crashed, victim.rss_mb,
               victim.seconds, warnings, healed, note=note)


def file_attacks(recipe: Path, work: Path, keys: dict, ctx: Context, writer: dict,
                 log) -> list[Row]:
    rows = []
    for n, (name, (attack, spoilt, upto)) in enumerate(FILE_ATTACKS.items()):
        remote = work / f"remote-{n}"
        shutil.copytree(work / "remote", remote, symlinks=True)
        entry = remote / keys[spoilt][:2] / keys[spoilt]
        attack(entry, keys[spoilt], ctx)
        victim = build(f"victim-{n}", recipe, upto, f"file://{remote}", writer, work)
        checker = build(f"check-{n}", recipe, spoilt, f"file://{remote}", writer, work)
        note = ""
        if upto != spoilt:
            note = f"{upto}: {status(victim, upto)} (the remote stayed in use)"
        rows.append(judge(name, victim, spoilt, checker, note))
        log(f"  {name}: victim {status(victim, spoilt)}, exit {victim.code}, "
            f"{victim.seconds:.1f} s, {victim.rss_mb:.0f} MB")
    return rows


# -- S3 ------------------------------------------------------------------------------------------
class FreezableProxy:
    """TCP proxy to the S3 server that stops answering after ``freeze_after_puts`` PUT
    requests (0: frozen from the first byte); connections stay open, nothing comes back."""

    def __init__(self, upstream: tuple[str, int], freeze_after_puts: int):
        self.upstream, self.left = upstream, freeze_after_puts
        self.frozen = threading.Event()
        if freeze_after_puts == 0:
            self.frozen.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(client)
            if self.frozen.is_set():
                continue
            server = socket.create_connection(self.upstream)
            self.held.append(server)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests and data.startswith(b"PUT "):
                    self.left -= 1
                    if self.left < 0:
                        self.frozen.set()
                if self.frozen.is_set():
                    return
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for sock in self.held:
            sock.close()


@contextmanager
def moto_server(work: Path) -> Iterator[tuple[str, int]]:
    """moto's S3 server in its own process (an in-process server would hold the 1 GiB object
    in this process, and every victim forked from it would count those pages as its own)."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=work)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        process.wait()


def s3_attacks(recipe: Path, work: Path, ctx: Context, writer: dict, timeout: float,
               local: Run, log) -> list[Row]:
    with moto_server(work) as (host, port):
        return _s3_attacks(recipe, work, ctx, writer, timeout, local, log, host, port)


def _s3_attacks(recipe, work, ctx, writer, timeout, local, log, host, port) -> list[Row]:
    import boto3
    import s3fs

    bucket = f"attacks-{uuid.uuid4().hex[:8]}"
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    os.environ.update(aws)
    rows = []
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir(bucket)
        url = f"s3://{bucket}/cache"
        a = build("s3-a", recipe, "import", url, {**writer, **aws}, work)
        assert a.code == 0, a.stderr[-2000:]
        key = a.report["stages"]["import"]["key"]
        big = ctx.scratch / "big.bin"
        with open(big, "wb") as fh:
            fh.truncate(ctx.oversize)
        from boto3.s3.transfer import TransferConfig

        boto3.client("s3").upload_file(str(big), bucket, f"cache/{key[:2]}/{key}/import.json",
                                       Config=TransferConfig(multipart_chunksize=64 << 20,
                                                             max_concurrency=1))
        big.unlink()
        victim = build("s3-victim", recipe, "import", url, {**writer, **aws}, work)
        checker = build("s3-check", recipe, "import", url, {**writer, **aws}, work)
        rows.append(judge("S3: oversized object (1 GiB for 489 B)", victim, "import", checker))
        log(f"  S3 oversized: victim {status(victim, 'import')}, {victim.rss_mb:.0f} MB")

        for name, puts in (("S3 frozen from the start", 0), ("S3 frozen mid-push", 2)):
            proxy = FreezableProxy((host, port), puts)
            env = {**writer, **aws, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
                   "NPUBUILD_REMOTE_TIMEOUT": str(timeout)}
            victim = build(f"frozen-{puts}", recipe, "surgery", f"s3://{bucket}/frozen-{puts}",
                           env, work)
            proxy.close()
            rows.append(judge(name, victim, "surgery", None,
                              f"+{victim.seconds - local.seconds:.1f} s over a local build"))
            log(f"  {name}: exit {victim.code}, {victim.seconds:.1f} s")

        closed = socket.create_server(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
        closed.close()
        env = {**writer, **aws, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead_port}"}
        victim = build("refused", recipe, "surgery", f"s3://AKIABENCHKEYID:{SECRET}@{bucket}/c",
                       env, work)
        row = judge("S3 refused, credentials in the URL", victim, "surgery", None,
                    f"+{victim.seconds - local.seconds:.1f} s over a local build")
        shown = victim.stdout + victim.stderr
        row.secret_shown = "yes" if SECRET in shown or "AKIABENCHKEYID" in shown else "no"
        rows.append(row)
    finally:
        for name in aws:
            os.environ.pop(name, None)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oversize-mib", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="NPUBUILD_REMOTE_TIMEOUT for the frozen-remote rows (default 10)")
    parser.add_argument("--skip-s3", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npubuild.engine.signing import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, generate_key_pair
    from tests.conftest import TINY_RECIPE

    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="remote-attacks-") as tmp:
        work = Path(tmp)
        recipe = work / "tiny.yaml"
        recipe.write_text(TINY_RECIPE)
        ctx = Context(work / "writer.key", work, args.oversize_mib << 20)
        generate_key_pair(ctx.writer_key)
        os.environ.pop(TRUSTED_KEYS_ENV, None)  # the writer's own key is the one trusted
        writer = {SIGNING_KEY_ENV: str(ctx.writer_key)}
        a = build("a", recipe, "verify", f"file://{work / 'remote'}", writer, work)
        assert a.code == 0, a.stderr[-2000:]
        keys = {s: v["key"] for s, v in a.report["stages"].items()}
        local = build("local", recipe, "surgery", None, writer, work)
        clean = build("clean", recipe, "import", f"file://{work / 'remote'}", writer, work)
        rows = [Row("(none: a clean remote)", False, clean.code != 0, clean.rss_mb, clean.seconds,
                    sum("remote cache" in line for line in clean.stderr.splitlines()),
                    note=f"import: {status(clean, 'import')}"),
                Row("(none: no remote, build to surgery)", False, local.code != 0, local.rss_mb,
                    local.seconds, 0)]
        rows += file_attacks(recipe, work, keys, ctx, writer, log)
        if not args.skip_s3:
            rows += s3_attacks(recipe, work, ctx, writer, args.timeout, local, log)
    print("| attack | accepted | crashed | peak RSS MB | seconds | warnings | healed by the "
          "next push | secret shown | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.attack} | {'YES' if r.accepted else 'no'} | {'YES' if r.crashed else 'no'} | "
              f"{r.rss_mb:.0f} | {r.seconds:.1f} | {r.warnings} | {r.healed} | {r.secret_shown} | "
              f"{r.note} |")
    bad = [r for r in rows if r.accepted or r.crashed or r.rss_mb >= MAX_RSS_MB
           or r.secret_shown == "yes" or r.seconds - local.seconds > MAX_EXTRA_SECONDS]
    print(f"\n{len(rows) - 2} attacks: {sum(r.accepted for r in rows)} accepted, "
          f"{sum(r.crashed for r in rows)} crashed, peak RSS {max(r.rss_mb for r in rows):.0f} MB, "
          f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
