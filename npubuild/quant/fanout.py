"""Calibration batches on Dask workers.

The driver loads and preprocesses the samples and sends them in the workflow's fixed-size
batches; each worker rebuilds the lowered NPU graphs once from the split stage's artifacts
(fetched by key through the content cache) and sends back the batch's statistics, which the
driver merges in batch order. At most ``WINDOW_PER_WORKER`` batches per worker are in flight,
so memory stays bounded however many samples there are.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from npubuild.engine.fetch import StageArtifacts
from npubuild.distributed import dask_client, ordered_submit
from npubuild.quant.workflow import BatchMapper, Options, Workflow

WINDOW_PER_WORKER = 2
_WORKFLOWS: dict[tuple[str, str], Workflow] = {}


def observe_batch(split: StageArtifacts, options: Options, batch: list) -> tuple[int, list[dict]]:
    """What one worker does for one batch (the workflow is built once per worker process)."""
    from npubuild.quant.pipeline import SplitPipeline

    memo = (split.key, repr(options))
    if memo not in _WORKFLOWS:
        _WORKFLOWS[memo] = Workflow(SplitPipeline(split.materialise()), options)
    return _WORKFLOWS[memo].observe_batch(batch)


def calibration_on_dask(scheduler: str, split: StageArtifacts, options: Options) -> BatchMapper:
    """A ``map_batches`` for :meth:`Workflow.calibrate` that runs on the Dask scheduler."""

    def map_batches(batches: Iterable[list]) -> Iterator[tuple[int, list[dict]]]:
        with dask_client(scheduler) as client:
            window = WINDOW_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))
            calls = ((split, options, batch) for batch in batches)
            yield from ordered_submit(client, observe_batch, calls, window)

    return map_batches
