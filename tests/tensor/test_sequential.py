"""Tensor.sequential (tinygrad's API): callables applied in order; bad items raise ArgumentError naming the item."""
import numpy as np
import pytest

from plugrad import Tensor, nn
from plugrad.tensor.helpers import ArgumentError


def test_sequential_applies_layers_methods_and_functions_in_order():
  conv, bn = nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
  x = Tensor(np.random.default_rng(0).standard_normal((1, 2, 5, 5), dtype=np.float32))
  got = x.sequential([conv, bn, Tensor.relu, lambda t: t * 2]).numpy()
  want = ((bn(conv(x)).relu()) * 2).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert (got >= 0).all() and got.shape == (1, 3, 5, 5)
  assert x.sequential([]) is x


@pytest.mark.parametrize("ll, what", [(Tensor.relu, "list of callables"), ([Tensor.relu, 3], "item 1 is not callable"),
                                      ([lambda t: 1.0], "returned float")])
def test_sequential_bad_input(ll, what):
  with pytest.raises(ArgumentError, match=what): Tensor.ones(2).sequential(ll)
