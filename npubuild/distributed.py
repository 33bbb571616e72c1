"""Fan work out: sequentially, on local worker processes, or on a Dask cluster.

``--scheduler tcp://HOST:PORT`` (or ``$NPUBUILD_SCHEDULER``) sends tasks to a running Dask
scheduler; ``--scheduler local:N`` starts a ``distributed.LocalCluster`` of N single-threaded
worker processes, once per invocation (`one_cluster`): every fan-out of the command shares it. Tasks are plain functions of picklable
arguments that exchange artifacts only through the content cache (local, or the remote level
when one is configured), never through a shared working directory. Without a scheduler Dask is
never imported.
"""

from __future__ import annotations

import os
import re
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence

from npubuild.errors import BuildError, UserError

SCHEDULER_ENV = "NPUBUILD_SCHEDULER"
LOCAL_PATTERN = re.compile(r"^local:(\d+)$")
CONNECT_TIMEOUT_SECONDS = 10


def resolve_scheduler(override: str | None = None) -> str | None:
    """``--scheduler`` wins, then ``$NPUBUILD_SCHEDULER``; None means no Dask."""
    return override or os.environ.get(SCHEDULER_ENV) or None


_SHARED: dict[str, list] = {}  # address -> [client or None, ExitStack], while one_cluster runs


@contextmanager
def one_cluster(address: str | None) -> Iterator[None]:
    """Within the block every fan-out to ``address`` shares one client (and, for ``local:N``,
    one cluster), started on first use and closed at the end; no fan-out, no cluster. The
    CLI and `npubuild.api.build` wrap a whole invocation in it: calibration batches, verify
    samples, the precision search's scoring and matrix cells of one command run on the same
    workers. A stage that fans out more work calls ``map_tasks(fn, calls,
    scheduler=ctx.scheduler)`` or ``dask_client(ctx.scheduler)`` and joins the same cluster."""
    if not address or address in _SHARED:
        yield
        return
    with ExitStack() as stack:
        _SHARED[address] = [None, stack]
        try:
            yield
        finally:
            del _SHARED[address]


@contextmanager
def dask_client(address: str) -> Iterator[Any]:
    """A ``distributed.Client`` for ``address`` (``local:N`` or a scheduler URL); inside
    `one_cluster` the shared one."""
    shared = _SHARED.get(address)
    if shared is not None:
        if shared[0] is None:
            shared[0] = shared[1].enter_context(_connect(address))
        yield shared[0]
        return
    with _connect(address) as client:
        yield client


@contextmanager
def _connect(address: str) -> Iterator[Any]:
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise UserError("--scheduler needs Dask's distributed scheduler, which is not installed",
                        hint="pip install 'npubuild[dask]'") from exc
    local = LOCAL_PATTERN.match(address)
    if local:
        workers = int(local.group(1))
        if workers < 1:
            raise UserError(f"--scheduler {address}: a local cluster needs at least one worker")
        with _local_cluster(LocalCluster, address, workers) as cluster, Client(cluster) as client:
            yield client
        return
    if "://" not in address:
        raise UserError(f"--scheduler {address!r} is neither local:N nor a scheduler address",
                        hint="e.g. --scheduler local:2 or --scheduler tcp://10.0.0.5:8786")
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_SECONDS)
    except (OSError, TimeoutError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}",
                        hint="start one with `dask scheduler` and workers with `dask worker "
                             f"{address}`, or use --scheduler local:N") from exc
    with client:
        yield client


def _local_cluster(cluster_class: Any, address: str, workers: int) -> Any:
    """A local cluster of ``workers`` single-threaded processes, or one BuildError saying why
    not (the workers are spawned: a script that builds must guard its top level)."""
    try:
        return cluster_class(n_workers=workers, threads_per_worker=1, processes=True,
                             dashboard_address=None)
    except Exception as exc:  # Dask raises RuntimeError/TimeoutError/OSError, wrapped variously
        raise BuildError(f"--scheduler {address}: the local Dask cluster did not start: "
                         f"{type(exc).__name__}: {exc}",
                         hint="worker processes are spawned and re-import the main module: a "
                              "script must build under `if __name__ == \"__main__\":` (not "
                              "from stdin); or start `dask scheduler` and workers and use "
                              "--scheduler tcp://HOST:PORT") from exc


def map_tasks(func: Callable[..., Any], calls: Sequence[tuple], *, scheduler: str | None = None,
              jobs: int = 1) -> list[Any]:
    """``[func(*args) for args in calls]``, in order, on Dask, worker processes or in-process."""
    if not calls:
        return []
    if scheduler:
        with dask_client(scheduler) as client:
            futures = client.map(func, *zip(*calls), pure=False)
            return client.gather(futures)
    if jobs <= 1 or len(calls) == 1:
        return [func(*args) for args in calls]
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls))) as pool:
        return list(pool.map(func, *zip(*calls)))


def ordered_submit(client: Any, func: Callable[..., Any], calls: Iterable[tuple],
                   window: int) -> Iterator[Any]:
    """Submit ``func(*args)`` for each call with at most ``window`` in flight; yield results in
    the order of the calls (so a reduction over them is the same on any cluster)."""
    pending: deque = deque()
    for args in calls:
        pending.append(client.submit(func, *args, pure=False))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
