"""The ONNX frontend's typed errors: each names the node (its name, or its index and op) and what was wrong."""
from __future__ import annotations


class OnnxError(ValueError):
  """A model that cannot be loaded or run: a bad input, a malformed graph, an attribute out of its range."""


class UnsupportedOnnxOpError(OnnxError, NotImplementedError):
  """An operator (or a form of one: an attribute value, a dtype) the frontend does not map onto the Tensor API."""
