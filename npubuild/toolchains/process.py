"""Run a worker script inside a toolchain's environment, with only files crossing.

The worker (a script in `npubuild.toolchains.workers`, run by the environment's own Python, so
it imports the vendor's packages and never npubuild) reads a job JSON that names its input
files (ONNX, npz, tflite) and writes its artifacts, its log and ``result.json`` into its working
folder. The environment's ``bin`` leads PATH (vendor scripts run through ``/usr/bin/env
python3``), npubuild's PYTHONPATH is dropped, and where the kernel allows it the process runs in
a network namespace of its own (``unshare -n``: no network at all); elsewhere proxies are
pointed nowhere and hubs set offline.

A failure becomes one `BuildError` naming the stage, the submodel and the vendor's own error
line (`vendor_error`), with the vendor's suggested fix when it printed one; never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from npubuild.errors import BuildError
from npubuild.toolchains.env import Env

WORKERS = Path(__file__).parent / "workers"
RESULT = "result.json"
REPLY = "@@npubuild-reply"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "no_proxy": "", "NO_PROXY": ""}


@cache
def can_unshare() -> bool:
    """Whether ``unshare -n`` gives this user a network namespace (root, or user namespaces)."""
    tool = shutil.which("unshare")
    if tool is None:
        return False
    for args in ([tool, "-n", "true"], [tool, "-rn", "true"]):
        try:
            if subprocess.run(args, capture_output=True, timeout=10).returncode == 0:
                return True
        except (OSError, subprocess.SubprocessError):
            pass
    return False


def _unshare_prefix() -> list[str]:
    if not can_unshare():
        return []
    tool = shutil.which("unshare")
    ok = subprocess.run([tool, "-n", "true"], capture_output=True).returncode == 0
    return [tool, "-n"] if ok else [tool, "-rn"]


def environment(env: Env) -> dict[str, str]:
    """The worker's environment: the toolchain's bin first on PATH, no npubuild paths, offline."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("NPUBUILD_")}
    out["PATH"] = os.pathsep.join([str(env.bin), out.get("PATH", os.defpath)])
    out["VIRTUAL_ENV"] = str(env.bin.parent)
    out["PYTHONHASHSEED"] = "0"
    out["PYTHONUNBUFFERED"] = "1"
    out.update(OFFLINE)
    return out


def die_with_parent() -> None:
    """In the worker, before exec: end it when npubuild ends (Linux's PR_SET_PDEATHSIG), so
    a killed build leaves no vendor process running."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the worker ends when its pipes close
        pass


def command(env: Env, script: str, *args: str) -> list[str]:
    return [*_unshare_prefix(), str(env.python), str(WORKERS / script), *args]


def run_worker(env: Env, script: str, job: dict, workdir: Path, *, stage: str, graph: str,
               patterns: Sequence[str] = (), timeout: float = 3600) -> dict:
    """Run ``script`` on ``job`` in ``workdir``; returns its ``result.json`` or raises the
    vendor's error as one message."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.json").write_text(json.dumps(job, indent=1, sort_keys=True), encoding="utf-8")
    log_path = workdir / f"{Path(script).stem}.log"
    (workdir / RESULT).unlink(missing_ok=True)
    with open(log_path, "w", encoding="utf-8") as log_file:
        try:
            code = subprocess.run(command(env, script, "job.json"), cwd=workdir, env=environment(env),
                                  stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout,
                                  preexec_fn=die_with_parent).returncode
        except subprocess.TimeoutExpired:
            raise BuildError(f"{graph}: {env.toolchain.name} did not finish in {timeout:.0f} s "
                             f"(log: {log_path})", stage=stage) from None
    result = _read_result(workdir)
    if code != 0 or not result.get("ok"):
        raise vendor_error(env, stage, graph, result, log_path, patterns)
    return result


def _read_result(workdir: Path) -> dict:
    try:
        return json.loads((workdir / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"ok": False, "error": "the worker wrote no result (it crashed or was killed)"}


def vendor_error(env: Env, stage: str, graph: str, result: dict, log_path: Path,
                 patterns: Sequence[str] = ()) -> BuildError:
    """One message: the stage, the submodel, the vendor's own error line and its fix."""
    text = ANSI.sub("", log_path.read_text(encoding="utf-8", errors="replace")) if log_path.is_file() else ""
    line = vendor_line(text, patterns) or (result.get("error") or "").strip().splitlines()[-1:] or ["?"]
    line = line if isinstance(line, str) else line[0]
    fix = result.get("suggestion") or suggestion(text)
    name = env.toolchain.name
    return BuildError(f"{graph}: {name} failed: {line.strip()[:600]}", stage=stage,
                      hint=(f"{name} suggests: {fix}; " if fix else "") + f"the whole log: {log_path}")


def vendor_line(text: str, patterns: Sequence[str]) -> str | None:
    """The first line of ``text`` matching one of the vendor's error patterns (regexes)."""
    for pattern in patterns:
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(0).strip()
    return None


SUGGESTION = re.compile(r"((?:[Pp]lease|[Tt]ry to|[Yy]ou can|[Yy]ou may)[^\n]{5,300})")


def suggestion(text: str) -> str | None:
    """The vendor's own advice nearest the failure (its last "Please ..." / "You can ...")."""
    found = SUGGESTION.findall(text)
    return found[-1].strip() if found else None


class Worker:
    """A long-lived worker (one per artifact) answering requests one at a time: each request
    names an input npz and an output npz; the worker writes the output and prints a reply
    line. Used where starting the vendor's runtime costs seconds and verify runs many samples."""

    def __init__(self, env: Env, script: str, job: dict, workdir: Path, *, stage: str,
                 graph: str, patterns: Sequence[str] = ()):
        self.env, self.workdir, self.stage, self.graph = env, workdir, stage, graph
        self.patterns = patterns
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "job.json").write_text(json.dumps(job, indent=1, sort_keys=True))
        self.log_path = workdir / f"{Path(script).stem}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(command(env, script, "job.json", "--serve"), cwd=workdir,
                                        env=environment(env), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._log, text=True,
                                        preexec_fn=die_with_parent)
        self.count = 0
        try:
            self._wait_reply()  # the worker says it is ready (its model built or loaded)
        except BaseException:
            self.close()  # a worker that failed to start leaves no process or open log behind
            raise

    def __call__(self, inputs: Path, outputs: Path) -> dict:
        self.count += 1
        self.process.stdin.write(json.dumps({"inputs": str(inputs), "outputs": str(outputs)}) + "\n")
        self.process.stdin.flush()
        return self._wait_reply()

    def _wait_reply(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY):])
                if not reply.get("ok"):
                    self._log.flush()
                    raise vendor_error(self.env, self.stage, self.graph, reply, self.log_path,
                                       self.patterns)
                return reply
            self._log.write(line)
        self._log.flush()
        raise vendor_error(self.env, self.stage, self.graph,
                           {"error": f"the worker exited (code {self.process.wait()})"},
                           self.log_path, self.patterns)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._log.close()

