"""Quantization's work on Dask workers: calibration batches and the precision search's scores.

Calibration: the driver loads and preprocesses the samples and sends them in the workflow's
fixed-size batches; each worker rebuilds the lowered NPU graphs once from the split stage's
artifacts (fetched by key through the content cache) and sends back the batch's statistics,
which the driver merges in batch order. At most ``WINDOW_PER_WORKER`` batches per worker are
in flight, so memory stays bounded however many samples there are.

The precision search (`SearchOnDask`): the verify samples and the fake-quant models go to
every worker once (``scatter``); each choice scored sends only its parameter inputs, each
confirmation of a choice its quantized graphs, split into one batch of samples per worker,
and the driver judges the samples' values in sample order. A sample's values do not depend
on which worker ran it or with which others, so the choice, search.json and every artifact
are byte-identical to one process, on any number of workers.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from npubuild.distributed import dask_client, ordered_submit
from npubuild.engine.fetch import StageArtifacts
from npubuild.quant.fakequant import Exported, FakeQuantPipeline
from npubuild.quant.pipeline import SplitPipeline
from npubuild.quant.qgraph import QGraph
from npubuild.quant.workflow import BatchMapper, Options, Workflow

WINDOW_PER_WORKER = 2
_WORKFLOWS: dict[tuple[str, str], Workflow] = {}


def observe_batch(split: StageArtifacts, options: Options, batch: list) -> tuple[int, list[dict]]:
    """What one worker does for one batch (the workflow is built once per worker process)."""
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


# Per worker process, the latest search's fake-quant pipeline and split pipeline (a
# long-lived worker serves many); the lock keeps a worker's threads from sharing one mid-run
# (the fake-quant pipeline's feeds are state).
_SCORERS: dict[str, tuple[FakeQuantPipeline, threading.Lock]] = {}
_SPLITS: dict[str, SplitPipeline] = {}


def score_batch(split: StageArtifacts, key: str, exported: Mapping[int, Exported],
                samples: Sequence[Mapping[str, np.ndarray]], indices: Sequence[int],
                feeds: Mapping[int, dict], kept: Sequence[str]) -> list[dict]:
    """What one worker does for one batch of one choice: the ``kept`` values of the samples
    at ``indices`` under the fake-quant models ``exported`` (``key``: their digest)."""
    if key not in _SCORERS:
        _SCORERS.clear()
        _SCORERS[key] = (FakeQuantPipeline(split.materialise(), exported), threading.Lock())
    pipeline, lock = _SCORERS[key]
    with lock:
        return pipeline.run([samples[i] for i in indices], feeds, kept)


def reference_batch(split: StageArtifacts, qgraphs: Mapping[int, QGraph],
                    samples: Sequence[Mapping[str, np.ndarray]], indices: Sequence[int],
                    kept: Sequence[str]) -> list[dict]:
    """What one worker does for one batch of a confirmation: the ``kept`` values of the
    samples at ``indices`` with every NPU graph run by the integer reference of ``qgraphs``."""
    if split.key not in _SPLITS:
        _SPLITS.clear()
        _SPLITS[split.key] = SplitPipeline(split.materialise())
    runner, wanted = _SPLITS[split.key].quantized_runner(qgraphs), set(kept)
    return [{k: v for k, v in runner.run(dict(samples[i]), keep_intermediates=True).items()
             if k in wanted} for i in indices]


class SearchOnDask:
    """The precision search's work over the verify samples on the Dask workers: scoring its
    choices (`fake_quant`) and confirming them on the integer reference (`deployed_values`).
    The samples reach every worker once; each piece of work takes them in one contiguous
    batch per worker, batch ``j`` asked of the same worker every time (a hint, not a
    requirement: the workers are listed once, one gone since is skipped by Dask), where a
    sample's earlier runs are cached. ``samples``: every sample the search judges (a subset
    it passes is recognised by identity)."""

    def __init__(self, scheduler: str, split: StageArtifacts,
                 samples: Sequence[Mapping[str, np.ndarray]]):
        self.scheduler, self.split, self.samples = scheduler, split, list(samples)
        self.position = {id(s): i for i, s in enumerate(self.samples)}
        self._sent: tuple | None = None  # (client, future of the samples, workers)

    def fake_quant(self, split_dir, exported: Mapping[int, Exported]) -> FakeQuantOnDask:
        """What `PrecisionSearch` scores with (its ``fake_quant``)."""
        return FakeQuantOnDask(self, exported)

    def deployed_values(self, workflow: Workflow, samples, kept) -> list[dict]:
        """As ``workflow.deployed_values(samples, kept)`` (the adopted quantization), on the
        workers, in the order of ``samples``."""
        with dask_client(self.scheduler) as client:
            [qgraphs] = client.scatter([workflow.qgraphs()], broadcast=True)
            [done] = self.on_workers(client, samples,
                                     [(reference_batch, (self.split, qgraphs), (list(kept),))])
            return done

    def on_workers(self, client, samples, works: Sequence[tuple]) -> list[list]:
        """``fn(*head, every sample, batch, *tail)`` for each ``(fn, head, tail)`` of ``works``
        and each worker's batch of ``samples`` (their positions), all submitted before any is
        awaited; per work, the values in the order of ``samples``."""
        if self._sent is None or self._sent[0] is not client:  # once per search and client
            [everything] = client.scatter([self.samples], broadcast=True)
            workers = sorted(client.scheduler_info().get("workers", {})) or [None]
            self._sent = (client, everything, workers)
        _, everything, workers = self._sent
        indices = [self.position[id(s)] for s in samples]
        batches = np.array_split(np.asarray(indices), min(len(indices), len(workers)))
        futures = [[client.submit(fn, *head, everything, batch.tolist(), *tail, pure=False,
                                  **({"workers": [worker], "allow_other_workers": True}
                                     if worker else {}))
                    for batch, worker in zip(batches, workers)] for fn, head, tail in works]
        return [[values for batch in work for values in batch]
                for work in client.gather(futures)]


class FakeQuantOnDask:
    """`FakeQuantPipeline` on the Dask workers of ``search`` (the same values, in order)."""

    def __init__(self, search: SearchOnDask, exported: Mapping[int, Exported]):
        self.search, self.exported = search, dict(exported)
        digest = hashlib.blake2b(search.split.key.encode(), digest_size=16)
        for index in sorted(self.exported):
            self.exported[index].digest(digest)
        self.key = digest.hexdigest()
        self._models: tuple | None = None  # (client, future of the models)

    def tensors(self, index: int) -> list[str]:
        return list(self.exported[index].tensors)

    def layers(self, index: int) -> list[str]:
        return list(self.exported[index].layers)

    def wide(self, index: int) -> list[str]:
        return list(self.exported[index].wide)

    def run(self, samples, feeds: Mapping[int, dict[str, np.ndarray]], kept) -> list[dict]:
        """As `FakeQuantPipeline.run`, computed on the workers, in the order of ``samples``."""
        return self.run_all(samples, [feeds], kept)[0]

    def run_all(self, samples, feeds: Sequence[Mapping[int, dict[str, np.ndarray]]],
                kept) -> list[list[dict]]:
        """As `FakeQuantPipeline.run_all`: every choice's batches submitted before any is
        awaited (one round trip for several choices)."""
        with dask_client(self.search.scheduler) as client:
            if self._models is None or self._models[0] is not client:
                [models] = client.scatter([self.exported], broadcast=True)
                self._models = (client, models)
            head = (self.search.split, self.key, self._models[1])
            works = [(score_batch, head, (dict(one), list(kept))) for one in feeds]
            return self.search.on_workers(client, samples, works)
