"""How many threads a build's numeric libraries run on: the one policy, for ONNX Runtime's
sessions (`onnx_io.session`) and numpy's BLAS (`one_blas_thread`, where the integer reference
and GPTQ multiply).

A build shares its machine (the zoo builds two recipes at once, a user builds beside an IDE,
CI beside other jobs) and holds dozens of ONNX Runtime sessions, each with its own pool, plus
OpenBLAS's pool. Threads that wait by spinning, or a pool's thread that must be scheduled
before the caller can go on, cost far more wall time under load than the load explains (issue
23; `benchmarks/underload.py`). So:

- ONNX Runtime: `SESSION_THREADS` intra-op threads, on every machine, never spinning (a
  deployment's timing, `runtime.cpu_time`, opens its session as deployed: spinning; without
  spinning, `benchmarks/sessions.py` on 2 quiet cores: YOLOv8n-320's 241 nodes in one-node
  sessions 1,648 -> 28 ms a pass, the whole model alone 17 -> 21 ms). Not the
  machine's core count and not a setting: ONNX Runtime's float kernels give other last bits
  on another thread count (YOLOv8n-320's calibration ranges on 1 thread against 2), and a
  recipe must give the same bytes in any process on any machine.
- BLAS: one thread where the integer reference and GPTQ call it (`one_blas_thread`): LAPACK's
  blocked factorisations give other last bits on other thread counts (`quant.rounding`). Not
  for a whole stage: tried, and YOLOv8n-320's quantize beside two busy loops took 7.9 s of CPU
  against main's 5.5 (two runs each, docs/scaling.md).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from functools import lru_cache

SESSION_THREADS = 2  # a build's sessions, on any machine (one core, or sixty-four)
DEPLOYED_THREADS = 2  # a session timed as a deployment runs it (runtime.cpu_time), spinning
SPINNING = "session.intra_op.allow_spinning"


def apply_to_session(options, deployed: bool = False) -> None:
    """The policy on ONNX Runtime ``SessionOptions``: a build's session, or (``deployed``) one
    timed as a deployment runs it, at most `DEPLOYED_THREADS` spinning while they wait (a
    timing, never an artifact: it may follow the machine's cores)."""
    options.intra_op_num_threads = (max(1, min(DEPLOYED_THREADS, os.cpu_count() or 1))
                                    if deployed else SESSION_THREADS)
    options.add_session_config_entry(SPINNING, "1" if deployed else "0")
    # A build's session allocates from the system, not from an arena: ONNX Runtime's CPU
    # arena keeps its peak for the session's life, and a build holds many sessions at once
    # (deepbrain's 3-D U-Net: its float pipeline's sessions kept 1.5 GB after one sample,
    # 0.1 GB without). The values are the same either way.
    options.enable_cpu_mem_arena = deployed


@lru_cache(maxsize=1)
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # a dependency; without it BLAS keeps its own thread count
        return None
    return ThreadpoolController()


def one_blas_thread():
    """BLAS on one thread for the duration (a context manager; nests). On 2 shared cores one
    YOLOv8n-320 simulator run measured 0.8 s of CPU with 2 OpenBLAS threads, 0.16 s with one."""
    controller = _blas_controller()
    return controller.limit(limits=1, user_api="blas") if controller else nullcontext()
