"""Verify samples on Dask workers (``--scheduler``), as calibration batches are
(`npubuild.quant.fanout`).

The driver loads and preprocesses the samples and sends them in fixed-size batches; each
worker materialises the ``import``, ``surgery``, ``split`` and ``compile`` artifacts once, by
key, from the content cache (or the remote level), never from the driver's build directory,
and returns every sample's kept tensors (`npubuild.verify.samples`). The driver receives them
in sample order and judges them exactly as a one-process build does, so verify.json and the
report's figures are byte-identical. At most ``WINDOW_PER_WORKER`` batches per worker are in
flight.
"""

from __future__ import annotations

from itertools import islice
from typing import Iterable, Iterator, Mapping

from npubuild.engine.fetch import StageArtifacts
from npubuild.distributed import dask_client, ordered_submit
from npubuild.verify.samples import STAGES, Observed, SampleRun

VERIFY_BATCH = 8
WINDOW_PER_WORKER = 2
# One SampleRun per worker process: the latest build's (a long-lived worker serves many).
_RUNS: dict[tuple[str, ...], SampleRun] = {}


def observe_batch(sources: tuple[StageArtifacts, ...], batch: list) -> list[Observed]:
    """What one worker does for one batch of samples."""
    memo = tuple(s.key for s in sources)
    if memo not in _RUNS:
        _RUNS.clear()
        _RUNS[memo] = SampleRun({s.stage: s.materialise() for s in sources})
    run = _RUNS[memo]
    return [run(feeds) for feeds in batch]


def worker_sources(sources: Mapping[str, StageArtifacts]) -> tuple[StageArtifacts, ...] | None:
    """The stages a worker needs, by key; None when one of them is in no cache it can reach."""
    if any(stage not in sources for stage in STAGES):
        return None
    return tuple(sources[stage] for stage in STAGES)


def samples_on_dask(scheduler: str, sources: tuple[StageArtifacts, ...],
                    samples: Iterable) -> Iterator[Observed]:
    """Each sample's observed values, in the order of ``samples``, computed on the workers."""
    with dask_client(scheduler) as client:
        window = WINDOW_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))
        feeds = iter(samples)
        batches = iter(lambda: list(islice(feeds, VERIFY_BATCH)), [])
        for observed in ordered_submit(client, observe_batch,
                                       ((sources, batch) for batch in batches), window):
            yield from observed
