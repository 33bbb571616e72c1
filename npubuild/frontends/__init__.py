"""Frontends: each turns one family of source model formats into ONNX for the import stage.

Modules here import their framework (TensorFlow, tf2onnx...) lazily, inside functions, so that
importing npubuild stays fast.
"""
