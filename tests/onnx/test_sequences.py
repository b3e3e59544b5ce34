"""plugrad.onnx's sequences (a list of Tensors) and optionals (None when empty, else the value): the sequence ops against
onnx's reference evaluator, sequence- and optional-typed graph inputs and outputs (plain and under jit=True), the errors
that name the node; and the ops added with them that the node tests cover only in part (RoiAlign with per-roi sample
grids, MelWeightMatrix, Scan-8 with sequence_lens)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="plugrad.onnx parses models with the onnx package (pip install onnx)")
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from plugrad.onnx import OnnxError, OnnxModel, UnsupportedOnnxOpError

F = TensorProto.FLOAT


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 18) -> Any:
  return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])


def _seq(name: str, elem: int = F, shape: Any = None) -> Any:
  return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape)))


def _opt_seq(name: str) -> Any:
  return helper.make_value_info(name, helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))))


def _t(name: str, elem: int = F, shape: Any = None) -> Any: return helper.make_tensor_value_info(name, elem, shape)


def _numpy(v: Any) -> Any: return None if v is None else [t.numpy() for t in v] if isinstance(v, list) else v.numpy()


def _check(model: Any, feed: dict[str, Any], rtol: float = 1e-5, atol: float = 1e-6) -> dict[str, Any]:
  """plugrad's outputs equal the reference evaluator's (a sequence element by element); returns plugrad's."""
  ref = ReferenceEvaluator(model).run(None, feed)
  got = {k: _numpy(v) for k, v in OnnxModel(model)(**feed).items()}
  for (name, g), r in zip(got.items(), ref):
    if isinstance(r, list):
      assert isinstance(g, list) and len(g) == len(r), name
      for a, b in zip(g, r): np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    else:
      assert g.dtype == r.dtype and g.shape == r.shape, name
      np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
  return got


def test_sequence_ops_match_the_reference() -> None:
  n = helper.make_node
  c = lambda name, v: n("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [v]))
  nodes = [c("p0", 0), c("pm1", -1), c("p1", 1),
           n("SequenceConstruct", ["a", "b"], ["s"]),
           n("SequenceInsert", ["s", "a", "pm1"], ["s2"]),           # a, a, b: a negative position counts from the back
           n("SequenceInsert", ["s2", "b"], ["s3"]),                 # ... b appended
           n("SequenceErase", ["s3", "p1"], ["s4"]),                 # a, b, b
           n("SequenceErase", ["s4"], ["s5"]),                       # a, b: the last one by default
           n("SequenceAt", ["s3", "pm1"], ["last"]),
           n("SequenceLength", ["s4"], ["len"]),
           n("ConcatFromSequence", ["s4"], ["cat"], axis=1),
           n("ConcatFromSequence", ["s5"], ["stacked"], axis=-1, new_axis=1),
           n("SequenceEmpty", [], ["e"], dtype=F),
           n("SequenceInsert", ["e", "b"], ["e1"]),
           n("SplitToSequence", ["a", "p1"], ["rows"], axis=1),     # a scalar split: pieces of that size
           n("SplitToSequence", ["a"], ["cols"], axis=-1, keepdims=0)]
  outs = [_seq("s3"), _seq("s5"), _t("last"), _t("len", TensorProto.INT64), _t("cat"), _t("stacked"), _seq("e1"), _seq("rows"), _seq("cols")]
  m = _model(nodes, [_t("a", F, [2, 3]), _t("b", F, [2, 3])], outs)
  rng = np.random.default_rng(0)
  got = _check(m, {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal((2, 3)).astype(np.float32)})
  assert [len(got[k]) for k in ("s3", "s5", "e1", "rows", "cols")] == [4, 2, 1, 3, 3] and got["len"] == 3


def test_split_to_sequence_sizes_and_remainder() -> None:
  n = helper.make_node
  sizes = helper.make_tensor("sz", TensorProto.INT64, [3], [1, 4, 2])
  nodes = [n("Constant", [], ["sz"], value=sizes), n("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.INT64, [], [3])),
           n("SplitToSequence", ["x", "sz"], ["by_sizes"]), n("SplitToSequence", ["x", "k"], ["by_three"])]
  got = _check(_model(nodes, [_t("x", F, [7, 2])], [_seq("by_sizes"), _seq("by_three")]), {"x": np.arange(14, dtype=np.float32).reshape(7, 2)})
  assert [a.shape[0] for a in got["by_three"]] == [3, 3, 1]


def test_sequence_and_optional_graph_inputs_and_outputs() -> None:
  n = helper.make_node
  m = _model([n("OptionalHasElement", ["o"], ["has"]), n("Identity", ["o"], ["o2"]), n("SequenceLength", ["s"], ["len"]),
              n("Identity", ["s"], ["s2"])],
             [_opt_seq("o"), _seq("s", F, [2])], [_t("has", TensorProto.BOOL), _opt_seq("o2"), _t("len", TensorProto.INT64), _seq("s2")])
  model = OnnxModel(m)
  assert [(s.name, s.kind) for s in model.inputs] == [("o", ("optional", "sequence")), ("s", ("sequence",))]
  xs = [np.ones(2, np.float32), np.arange(2, dtype=np.float32)]
  out = model(o=None, s=xs)
  assert not out["has"].numpy() and out["o2"] is None and out["len"].numpy() == 2
  for a, b in zip(_numpy(out["s2"]), xs): np.testing.assert_array_equal(a, b)
  out = model(o=xs[:1], s=[])
  assert out["has"].numpy() and len(out["o2"]) == 1 and out["len"].numpy() == 0 and out["s2"] == []
  with pytest.raises(OnnxError, match="'s'.*a sequence"): model(o=None, s=xs[0])
  with pytest.raises(OnnxError, match="'s'.*shape"): model(o=None, s=[np.ones(3, np.float32)])


def test_jit_replays_with_sequences_and_optionals() -> None:
  # a Loop that appends a slice per iteration to a sequence that starts empty or from the optional input (onnx's
  # test_loop16_seq_none, smaller): under jit=True each structure (sequence length, empty or not) is its own capture
  n = helper.make_node
  then_g = helper.make_graph([n("SequenceEmpty", [], ["e"])], "then", [], [_seq("e")])
  else_g = helper.make_graph([n("OptionalGetElement", ["o_in"], ["g"])], "else", [], [_seq("g")])
  body = helper.make_graph(
    [n("Identity", ["c_in"], ["c_out"]), n("OptionalHasElement", ["o_in"], ["has"]), n("Not", ["has"], ["none"]),
     n("If", ["none"], ["s"], then_branch=then_g, else_branch=else_g), n("Mul", ["x", "x"], ["sq"]),
     n("SequenceInsert", ["s", "sq"], ["s_out"]), n("Optional", ["s_out"], ["o_out"])], "body",
    [_t("i", TensorProto.INT64, []), _t("c_in", TensorProto.BOOL, []), _opt_seq("o_in")], [_t("c_out", TensorProto.BOOL, []), _opt_seq("o_out")])
  m = OnnxModel(_model([n("Loop", ["trip", "", "o"], ["res"], body=body), n("OptionalGetElement", ["res"], ["seq"]),
                        n("ConcatFromSequence", ["seq"], ["cat"])],
                       [_t("trip", TensorProto.INT64, []), _opt_seq("o"), _t("x", F, [2])], [_t("cat", F, None)], opset=18), jit=True)
  for k in range(4):
    x = np.full(2, k + 1, np.float32)
    np.testing.assert_array_equal(m(trip=np.array(2), o=None, x=x)["cat"].numpy(), np.tile(x * x, 2))
    np.testing.assert_array_equal(m(trip=np.array(1), o=[x], x=x)["cat"].numpy(), np.concatenate([x, x * x]))
  assert len(m._jits) == 2


def test_errors_name_the_node() -> None:
  n = helper.make_node
  m = OnnxModel(_model([n("SequenceConstruct", ["a"], ["s"]), n("SequenceAt", ["s", "p"], ["y"])],
                       [_t("a", F, [1]), _t("p", TensorProto.INT64, [])], [_t("y", F, [1])]))
  np.testing.assert_array_equal(m(a=np.ones(1, np.float32), p=np.array(-1))["y"].numpy(), [1])
  with pytest.raises(OnnxError, match=r"node 1 \(SequenceAt\): position 1 is outside a sequence of 1"): m(a=np.ones(1, np.float32), p=np.array(1))
  m = OnnxModel(_model([n("OptionalGetElement", ["o"], ["y"])], [_opt_seq("o")], [_seq("y")]))
  with pytest.raises(OnnxError, match=r"node 0 \(OptionalGetElement\): .*empty optional"): m(o=None)
  m = OnnxModel(_model([n("SequenceEmpty", [], ["e"]), n("ConcatFromSequence", ["e"], ["y"])], [], [_t("y", F, None)]))
  with pytest.raises(OnnxError, match=r"node 1 \(ConcatFromSequence\): .*empty sequence"): m()
  with pytest.raises(UnsupportedOnnxOpError, match=r"SequenceEmpty.*STRING"):
    OnnxModel(_model([n("SequenceEmpty", [], ["e"], dtype=TensorProto.STRING)], [], [_seq("e", TensorProto.STRING)]))()
  map_in = helper.make_value_info("mp", helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F, None)))
  with pytest.raises(UnsupportedOnnxOpError, match="input 'mp': map_type values"):
    OnnxModel(_model([n("Identity", ["mp"], ["y"])], [map_in], [map_in]))


@pytest.mark.parametrize("ctm, mode", [("half_pixel", "avg"), ("output_half_pixel", "avg"), ("half_pixel", "max"), ("output_half_pixel", "max")])
def test_roi_align_with_per_roi_sample_grids(ctm: str, mode: str) -> None:
  # sampling_ratio=0: each roi samples ceil(bin size) points per bin and axis; rois partly outside, tiny and reversed
  rois = np.array([[0, 0, 9, 9], [2.5, 1, 7, 8.5], [-3, -2, 4, 3], [6, 6, 12, 14], [5, 5, 5.2, 5.1], [4, 4, 2, 3]], np.float32)
  x = np.random.default_rng(1).standard_normal((2, 3, 10, 12)).astype(np.float32)
  node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], coordinate_transformation_mode=ctm, mode=mode, output_height=3,
                          output_width=2, spatial_scale=0.9)
  m = _model([node], [_t("x", F, [2, 3, 10, 12]), _t("rois", F, [6, 4]), _t("bi", TensorProto.INT64, [6])], [_t("y", F, None)], opset=22)
  _check(m, {"x": x, "rois": rois, "bi": np.array([0, 1, 1, 0, 1, 0])}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mels, fft, rate, lo, hi", [(8, 64, 8000, 0.0, 4000.0), (5, 33, 16000, 300.0, 7000.0), (3, 16, 22050, 100.0, 11025.0)])
def test_mel_weight_matrix(mels: int, fft: int, rate: int, lo: float, hi: float) -> None:
  ins = [_t("n", TensorProto.INT64, []), _t("fft", TensorProto.INT64, []), _t("rate", TensorProto.INT64, []), _t("lo", F, []), _t("hi", F, [])]
  m = _model([helper.make_node("MelWeightMatrix", ["n", "fft", "rate", "lo", "hi"], ["y"], output_datatype=TensorProto.DOUBLE)], ins,
             [_t("y", TensorProto.DOUBLE, None)])
  _check(m, {"n": np.array(mels), "fft": np.array(fft), "rate": np.array(rate), "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)})


def test_scan8_batches_lengths_and_directions() -> None:
  # Scan-8: a batch axis first, each entry scanned along axis 1 for its own length; a running sum forwards, one backwards
  n = helper.make_node
  body = helper.make_graph([n("Add", ["s_in", "a"], ["s_out"]), n("Add", ["r_in", "b"], ["r_out"]), n("Identity", ["s_out"], ["y"]),
                            n("Identity", ["r_out"], ["z"])], "body",
                           [_t("s_in", F, [2]), _t("r_in", F, [2]), _t("a", F, [2]), _t("b", F, [2])],
                           [_t("s_out", F, [2]), _t("r_out", F, [2]), _t("y", F, [2]), _t("z", F, [2])])
  node = n("Scan", ["lens", "s0", "r0", "x", "x"], ["s", "r", "ys", "zs"], body=body, num_scan_inputs=2, directions=[0, 1])
  m = OnnxModel(_model([node], [_t("lens", TensorProto.INT64, [3]), _t("s0", F, [3, 2]), _t("r0", F, [3, 2]), _t("x", F, [3, 4, 2])],
                       [_t("s", F, None), _t("r", F, None), _t("ys", F, None), _t("zs", F, None)], opset=8))
  x = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
  s0 = np.ones((3, 2), np.float32)
  lens = [4, 2, 0]
  out = m(lens=np.array(lens), s0=s0, r0=s0, x=x)
  for b, k in enumerate(lens):
    np.testing.assert_allclose(out["s"].numpy()[b], s0[b] + x[b, :k].sum(0))
    np.testing.assert_allclose(out["r"].numpy()[b], s0[b] + x[b, :k].sum(0))
    np.testing.assert_allclose(out["ys"].numpy()[b, :k], s0[b] + np.cumsum(x[b, :k], 0))
    np.testing.assert_allclose(out["zs"].numpy()[b, :k], s0[b] + np.cumsum(x[b, :k][::-1], 0))  # the reverse scan's steps, in step order
  assert out["ys"].shape == (3, 4, 2)
