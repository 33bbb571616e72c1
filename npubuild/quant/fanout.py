"""Quantization's work on Dask workers: calibration batches and the precision search's scores.

Calibration: the driver loads and preprocesses the samples and sends them in the workflow's
fixed-size batches; each worker rebuilds the lowered NPU graphs once from the split stage's
artifacts (fetched by key through the content cache) and sends back the batch's statistics,
which the driver merges in batch order. At most ``WINDOW_PER_WORKER`` batches per worker are
in flight, so memory stays bounded however many samples there are.

The precision search (`FakeQuantOnDask`): the fake-quant models and the verify samples go to
every worker once (``scatter``); each choice scored sends only its parameter inputs, split into
one batch of samples per worker, and the driver judges the samples' values in sample order.
A sample's values do not depend on which worker ran it or with which others, so the choice,
search.json and every artifact are byte-identical to one process, on any number of workers.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from npubuild.engine.fetch import StageArtifacts
from npubuild.distributed import dask_client, ordered_submit
from npubuild.quant.fakequant import Exported, FakeQuantPipeline
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


# One fake-quant pipeline per worker process: the latest search's (a long-lived worker serves
# many); the lock keeps a worker's threads from sharing it mid-run (its feeds are state).
_SCORERS: dict[str, tuple[FakeQuantPipeline, threading.Lock]] = {}


def score_batch(split: StageArtifacts, key: str, context: tuple, indices: Sequence[int],
                feeds: Mapping[int, dict], kept: Sequence[str]) -> list[dict]:
    """What one worker does for one batch of one choice: the ``kept`` values of the samples
    at ``indices`` (``context``: the scattered fake-quant models and samples)."""
    exported, samples = context
    if key not in _SCORERS:
        _SCORERS.clear()
        _SCORERS[key] = (FakeQuantPipeline(split.materialise(), exported), threading.Lock())
    pipeline, lock = _SCORERS[key]
    with lock:
        return pipeline.run([samples[i] for i in indices], feeds, kept)


class FakeQuantOnDask:
    """`FakeQuantPipeline`'s ``run`` on the Dask workers, the samples in one contiguous batch
    per worker; batch ``j`` is asked of the same worker every time (a hint, not a
    requirement: the workers are listed once, a worker gone since is skipped by Dask), where
    the sample's earlier runs are cached. ``samples``: every sample the
    search will score (a subset it passes is recognised by identity)."""

    def __init__(self, scheduler: str, split: StageArtifacts,
                 samples: Sequence[Mapping[str, np.ndarray]], exported: Mapping[int, Exported]):
        self.scheduler, self.split = scheduler, split
        self.exported, self.samples = dict(exported), list(samples)
        self.position = {id(s): i for i, s in enumerate(self.samples)}
        digest = hashlib.blake2b(split.key.encode(), digest_size=16)
        for index in sorted(self.exported):
            digest.update(self.exported[index].model.SerializeToString())
        for sample in self.samples:
            for name in sorted(sample):
                digest.update(name.encode() + np.ascontiguousarray(sample[name]).tobytes())
        self.key = digest.hexdigest()
        self._sent: tuple | None = None  # (client, future of (models, samples), workers)

    def tensors(self, index: int) -> list[str]:
        return list(self.exported[index].tensors)

    def layers(self, index: int) -> list[str]:
        return list(self.exported[index].layers)

    def run(self, samples, feeds: Mapping[int, dict[str, np.ndarray]], kept) -> list[dict]:
        """As `FakeQuantPipeline.run`, computed on the workers, in the order of ``samples``."""
        return self.run_all(samples, [feeds], kept)[0]

    def run_all(self, samples, feeds: Sequence[Mapping[int, dict[str, np.ndarray]]],
                kept) -> list[list[dict]]:
        """As `FakeQuantPipeline.run_all`: every choice's batches submitted before any is
        awaited (one round trip for several choices), the values in order."""
        indices = [self.position[id(s)] for s in samples]
        with dask_client(self.scheduler) as client:
            if self._sent is None or self._sent[0] is not client:  # once per search and client
                [context] = client.scatter([(self.exported, self.samples)], broadcast=True)
                workers = sorted(client.scheduler_info().get("workers", {})) or [None]
                self._sent = (client, context, workers)
            _, context, workers = self._sent
            batches = np.array_split(np.asarray(indices), min(len(indices), len(workers)))
            futures = [[client.submit(score_batch, self.split, self.key, context, batch.tolist(),
                                      dict(one), list(kept), pure=False,
                                      **({"workers": [worker], "allow_other_workers": True}
                                         if worker else {}))
                        for batch, worker in zip(batches, workers)] for one in feeds]
            done = client.gather(futures)
            return [[values for batch in choice for values in batch] for choice in done]
