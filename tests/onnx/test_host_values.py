"""The ONNX frontend's host-known values are keyed by their Tensor, which the entry keeps alive: an id freed mid-run
(a Loop's per-iteration counter) can never be handed to a new Tensor that would then read the old value."""
import gc
import weakref

import numpy as np

from plugrad import Tensor
from plugrad.onnx.ops import HostValues


def test_an_entry_keeps_its_tensor_and_answers_only_for_it():
  h = HostValues()
  t = Tensor([3])
  ref = weakref.ref(t)
  h.put(t, np.array([3]))
  del t
  gc.collect()
  assert ref() is not None, "the entry must keep its Tensor alive, or its id could be reused"
  assert h.get(ref()) is not None and h.get(Tensor([3])) is None
  child = h.copy()
  child.put(Tensor([4]), np.array([4]))
  assert len(child._d) == 2 and len(h._d) == 1  # a subgraph's scope adds to its own copy
