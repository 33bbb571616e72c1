"""Running deployed models: the split model's submodels in order (`Runner`)."""

from npubuild.runtime.runner import Backend, GraphInfo, OnnxRuntimeBackend, Runner

__all__ = ["Backend", "GraphInfo", "OnnxRuntimeBackend", "Runner"]
