"""Frontends: each turns one family of source model formats into ONNX for the import stage.

Modules here import their framework (TensorFlow, tf2onnx...) lazily, inside functions, so that
importing npubuild stays fast.
"""

# The formats converted through TensorFlow and tf2onnx (the rest are read as ONNX): what the
# import stage's key asks the versions of, known without importing the import stage.
TF_FORMATS = ("tf_frozen", "saved_model", "keras", "tflite")
