"""What every worker shares: read the job, write result.json, serve requests.

Runs under a toolchain's own Python (imports only the standard library and numpy), never
npubuild's. A request on stdin names an input .npz and an output .npz; the reply is one line
``@@npubuild-reply {json}`` on stdout (the vendor may print anything else around it).
"""

import json
import sys
import traceback

REPLY = "@@npubuild-reply"


def job():
    with open(sys.argv[1], encoding="utf-8") as f:
        return json.load(f)


def write_result(result):
    with open("result.json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def failure(exc, suggestion=None):
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip(),
            "traceback": traceback.format_exc(), "suggestion": suggestion}


def reply(message):
    sys.stdout.flush()
    print(REPLY + json.dumps(message), flush=True)


def main(build, serve=None):
    """One-shot: ``build(job) -> result``; with --serve: ``serve(job) -> run(inputs, outputs)``
    is made once (its readiness replied), then each stdin line is one request."""
    spec = job()
    if "--serve" not in sys.argv:
        try:
            result = build(spec)
            result["ok"] = True
        except Exception as exc:  # the vendor's exception, reported as data
            result = failure(exc)
        write_result(result)
        sys.exit(0 if result["ok"] else 1)
    try:
        run = serve(spec)
    except Exception as exc:
        reply(failure(exc))
        sys.exit(1)
    reply({"ok": True, "ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply({"ok": True, **(run(request["inputs"], request["outputs"]) or {})})
        except Exception as exc:
            reply(failure(exc))
