"""Models exported from PyTorch with torch.onnx.export (bench/onnx.py builds them: a ResNet-18, a BERT-style encoder,
a GPT-style decoder with a dynamic sequence length) run through plugrad.onnx and match PyTorch."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="plugrad.onnx parses models with the onnx package (pip install onnx)")
torch = pytest.importorskip("torch", reason="the models are exported from PyTorch (pip install torch)")

from plugrad.onnx import OnnxError, OnnxModel


def _bench() -> Any:
  spec = importlib.util.spec_from_file_location("plugrad_onnx_bench", Path(__file__).resolve().parents[2] / "bench" / "onnx.py")
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _compare(model: Any, pg: OnnxModel, x: np.ndarray) -> None:
  got = [o.numpy() for o in pg(x=x).values()]
  with torch.no_grad(): ref = model(torch.from_numpy(x))
  ref = ref if isinstance(ref, tuple) else (ref,)
  assert len(got) == len(ref)
  for g, r in zip(got, ref):
    r = r.numpy()
    assert g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()))


@pytest.mark.parametrize("name,shape", [("resnet18", (1, 0)), ("encoder", (2, 16))])
def test_exported_model_matches_pytorch(name: str, shape: tuple[int, int]) -> None:
  ob = _bench()
  x = ob.MODELS[name][1](*shape)
  model, data = ob.export(name, x)
  _compare(model, OnnxModel(onnx.load_from_string(data)), x)


def test_decoder_with_a_dynamic_sequence_length_under_jit() -> None:
  ob = _bench()
  model, data = ob.export("decoder", ob.MODELS["decoder"][1](1, 12))
  proto = onnx.load_from_string(data)
  assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]
  pg = OnnxModel(proto, jit=True)
  for b, s in [(1, 12), (2, 5), (1, 12), (1, 12), (2, 5), (2, 5), (1, 30)]:  # each shape captured on its third call
    _compare(model, pg, ob.MODELS["decoder"][1](b, s))
  assert {k[0][0] for k in pg._jits} == {(1, 12), (2, 5), (1, 30)}


def test_bad_inputs_name_what_is_wrong() -> None:
  ob = _bench()
  _, data = ob.export("decoder", ob.MODELS["decoder"][1](1, 4))
  pg = OnnxModel(onnx.load_from_string(data))
  with pytest.raises(OnnxError, match=r"missing input\(s\) \['x'\]"): pg()
  with pytest.raises(OnnxError, match=r"unknown input\(s\) \['y'\]"): pg(x=np.zeros((1, 4), np.int64), y=1)
  with pytest.raises(OnnxError, match="the model takes dtypes.int64, got a float32 array"): pg(x=np.zeros((1, 4), np.float32))
  with pytest.raises(OnnxError, match=r"takes shape \('batch', 'seq'\), got \(4,\)"): pg(x=np.zeros(4, np.int64))


def test_cli_runs_a_model_and_names_bad_arguments(tmp_path: Path) -> None:
  import subprocess
  import sys
  ob = _bench()
  _, data = ob.export("decoder", ob.MODELS["decoder"][1](1, 4))
  path = tmp_path / "decoder.onnx"
  path.write_bytes(data)
  run = lambda *a: subprocess.run([sys.executable, "-m", "plugrad", "onnx", *a], capture_output=True, text=True, timeout=300)
  out = run(str(path), "--dim", "batch=2", "--dim", "seq=7", "--runs", "2", "--jit")
  assert out.returncode == 0, out.stderr
  assert "input  x: (2, 7) int64" in out.stdout and "output " in out.stdout and "(2, 7, 8192) float32" in out.stdout
  assert "warm best" in out.stdout
  np.save(tmp_path / "ids.npy", np.zeros((1, 3), np.int64))
  assert run(str(path), "--input", f"x={tmp_path / 'ids.npy'}", "--runs", "0").returncode == 0
  bad = run(str(path), "--input", f"y={tmp_path / 'ids.npy'}")
  assert bad.returncode == 2 and "--input names ['y'] are not inputs of the model; its inputs are ['x']" in bad.stderr
  missing = run(str(tmp_path / "nope.onnx"))
  assert missing.returncode == 1 and "nope.onnx" in missing.stderr


def test_jit_captures_and_host_results_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
  from onnx import TensorProto, helper

  from plugrad.onnx import model as onnx_model
  monkeypatch.setattr(onnx_model, "MAX_JITS", 2)
  monkeypatch.setattr(onnx_model, "MAX_FOLDED", 3)
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
  g = helper.make_graph([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
                         helper.make_node("Add", ["r", "r"], ["y"])], "g", [x], [y])
  m = OnnxModel(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), jit=True)
  for n in (3, 4, 5, 3, 6, 7):
    np.testing.assert_array_equal(m(x=np.arange(n, dtype=np.float32))["y"].numpy(), 2 * np.arange(n, dtype=np.float32))
  assert len(m._jits) == 2 and len(m._folded) <= 3
