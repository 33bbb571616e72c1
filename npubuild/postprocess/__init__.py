"""CPU post-processing that recipes document for the outputs they cut off the NPU graph."""
