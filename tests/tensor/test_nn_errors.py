"""Bad input to the nn, indexing and scan Tensor methods fails at the call, before anything is scheduled, with a
typed error whose message names the shapes (or values) involved."""
import re

import numpy as np
import pytest

from plugrad.tensor.tensor import Tensor
from plugrad.uop.shape import ShapeError


def t(*shape: int, dtype=None) -> Tensor:
  return Tensor(np.zeros(shape, dtype=np.float32)) if dtype is None else Tensor(np.zeros(shape, dtype=dtype))


CASES = [
  # (call, error type, message pattern)
  (lambda: t(1, 3, 5, 5).conv2d(t(4, 2, 3, 3)), ShapeError, r"\(1, 3, 5, 5\).*\(4, 2, 3, 3\)"),
  (lambda: t(1, 4, 5, 5).conv2d(t(4, 2, 3, 3), groups=3), ShapeError, r"groups=3"),
  (lambda: t(1, 2, 5, 5).conv2d(t(4, 2, 3)), ShapeError, r"\(1, 2, 5, 5\).*\(4, 2, 3\)"),
  (lambda: t(1, 2, 5, 5).conv2d(t(4, 2, 3, 3), t(3)), ShapeError, r"bias \(3,\)"),
  (lambda: t(1, 2, 2, 2).conv2d(t(4, 2, 3, 3)), ShapeError, r"window \(3, 3\).*\(2, 2\)"),
  (lambda: t(1, 2, 5, 5).conv2d(t(4, 2, 3, 3), padding=(1, 2, 3)), ValueError, r"padding.*\(1, 2, 3\)"),
  (lambda: t(1, 2, 5, 5).conv2d(t(4, 2, 3, 3), stride=0), ValueError, r"stride"),
  (lambda: t(1, 3, 4, 4).conv_transpose2d(t(2, 3, 3, 3)), ShapeError, r"\(1, 3, 4, 4\).*\(2, 3, 3, 3\)"),
  (lambda: t(1, 2, 4, 4).conv_transpose2d(t(2, 3, 3, 3), stride=2, output_padding=2), ValueError, r"output_padding"),
  (lambda: t(1, 1, 4, 4).avg_pool2d((5, 5)), ShapeError, r"\(5, 5\)"),
  (lambda: t(1, 1, 4, 4).max_pool2d((2, 2), padding=2), ValueError, r"half the kernel"),
  (lambda: t(4).max_pool2d((2, 2)), ShapeError, r"\(4,\)"),
  (lambda: t(1, 1, 2, 2).max_unpool2d(t(1, 1, 2, 3, dtype=np.int32)), ShapeError, r"\(1, 1, 2, 2\).*\(1, 1, 2, 3\)"),
  (lambda: t(3, 4).softmax(2), IndexError, r"dim 2"),
  (lambda: t(3, 4).log_softmax(-3), IndexError, r"dim -3"),
  (lambda: t(3).gelu("fast"), ValueError, r"'fast'"),
  (lambda: t(3).dropout(1.5), ValueError, r"1\.5"),
  (lambda: t(3).one_hot(4), TypeError, r"integer"),
  (lambda: t(3, dtype=np.int32).one_hot(-2), ValueError, r"-2"),
  (lambda: t(2, 3).layernorm(axis=2), IndexError, r"dim 2"),
  (lambda: t(2, 3, 4).batchnorm(t(5), None, t(3), t(3)), ShapeError, r"weight \(5,\)"),
  (lambda: t(1, 3, 4).scaled_dot_product_attention(t(1, 5, 3), t(1, 5, 2)), ShapeError, r"\(1, 3, 4\).*\(1, 5, 3\)"),
  (lambda: t(4, 3).cross_entropy(t(5, dtype=np.int32)), ShapeError, r"\(4, 3\).*\(5,\)"),
  (lambda: t(4, 3).cross_entropy(t(4, dtype=np.int32), reduction="avg"), ValueError, r"'avg'"),
  (lambda: t(4, 3).cross_entropy(t(4, dtype=np.int32), label_smoothing=2.0), ValueError, r"label_smoothing"),
  (lambda: t(4, 3).nll_loss(t(4, 2, dtype=np.int32)), ShapeError, r"\(4, 3\).*\(4, 2\)"),
  (lambda: t(4, 3).nll_loss(t(4)), TypeError, r"integers"),
  (lambda: t(4, 3).sparse_categorical_crossentropy(t(3, dtype=np.int32)), ShapeError, r"\(4, 3\).*\(3,\)"),
  (lambda: t(4).binary_crossentropy(t(3)), ShapeError, r"\(4,\).*\(3,\)"),
  (lambda: t(1, 1, 4).interpolate((3,), mode="cubic"), ValueError, r"'cubic'"),
  (lambda: t(1, 1, 4).interpolate((3, 3, 3, 3)), ValueError, r"size"),
  (lambda: t(1, 1, 4).interpolate((3,), mode="nearest", align_corners=True), ValueError, r"align_corners"),
  (lambda: Tensor.einsum("ij,jk->ik", t(2, 3), t(4, 2)), ShapeError, r"'j' has size 3.*4"),
  (lambda: Tensor.einsum("ij,jk->ik", t(2, 3)), ValueError, r"2 operands, got 1"),
  (lambda: Tensor.einsum("ijk->ij", t(2, 3)), ShapeError, r"\(2, 3\)"),
  # indexing
  (lambda: t(3, 4)[3], IndexError, r"index 3 .* size 3"),
  (lambda: t(3, 4)[0, -5], IndexError, r"index -5 .* size 4"),
  (lambda: t(3, 4)[0, 1, 2], IndexError, r"too many indices.*\(3, 4\)"),
  (lambda: t(3, 4)[..., 0, ...], IndexError, r"single ellipsis"),
  (lambda: t(3, 4)[[0, 3]], IndexError, r"index 3 .* size 3"),
  (lambda: t(3, 4)[Tensor([0.5, 1.0])], TypeError, r"integer dtype"),
  (lambda: t(3, 4)[1.5], IndexError, r"float"),
  (lambda: t(3, 4)[::0], ValueError, r"step cannot be zero"),
  (lambda: t(3, 4)[[0, 1], [[0, 1, 2]]], ShapeError, r"\(2,\).*\(1, 3\)"),
  (lambda: t(3, 4).gather(1, t(3, 4, 1, dtype=np.int32)), ShapeError, r"\(3, 4, 1\).*\(3, 4\)"),
  (lambda: t(3, 4).gather(1, t(5, 1, dtype=np.int32)), ShapeError, r"\(5, 1\).*\(3, 4\)"),
  (lambda: t(3, 4).gather(2, t(3, 1, dtype=np.int32)), IndexError, r"dim 2"),
  (lambda: t(3, 4).gather(1, t(3, 1)), TypeError, r"integer dtype"),
  (lambda: t(3, 4).scatter(0, t(2, 2, dtype=np.int32), t(1, 2)), ShapeError, r"\(2, 2\).*src \(1, 2\)"),
  (lambda: t(3, 4).scatter(0, t(2, 2, dtype=np.int32), t(2, 2), reduce="max"), ValueError, r"'max'"),
  (lambda: t(3, 4).scatter_reduce(0, t(2, 2, dtype=np.int32), t(2, 2), "median"), ValueError, r"'median'"),
  (lambda: t(3, 4).scatter_reduce(0, t(2, 2, dtype=np.int32), t(2, 2, dtype=np.int32), "sum"), TypeError, r"dtype"),
  (lambda: t(3, 4).masked_select(t(3, 4)), TypeError, r"bool"),
  (lambda: t(3, 4).masked_select(t(2, 4, dtype=bool)), ShapeError, r"\(3, 4\).*\(2, 4\)"),
  (lambda: t(3).tril(), ValueError, r"\(3,\)"),
  (lambda: t(2, 2, 2).diag(), ValueError, r"\(2, 2, 2\)"),
  (lambda: t(2, 3).diagonal(dim1=1, dim2=-1), ValueError, r"differ"),
  (lambda: t(2, 3).unfold(1, 4, 1), ShapeError, r"size 4.*\(2, 3\)"),
  (lambda: t(2, 3).unfold(1, 2, 0), ValueError, r"step"),
  # scans
  (lambda: t(2, 3).cumsum(2), IndexError, r"dim 2"),
  (lambda: t(2, 3).cumprod(-3), IndexError, r"dim -3"),
  (lambda: t(2, 3).sort(5), IndexError, r"dim 5"),
  (lambda: t(2, 3).topk(4), ValueError, r"k=4.*\(2, 3\)"),
  (lambda: t(2, 3).topk(-1), ValueError, r"k=-1"),
]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bad_input_raises_at_the_call(i):
  call, err, pattern = CASES[i]
  with pytest.raises(err) as info:
    call()
  assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"

