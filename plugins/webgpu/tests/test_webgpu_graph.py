"""The WEBGPU graph runner: a JIT batch replayed as one submission, with new input buffers patched in."""
import numpy as np


def test_jit_batch_replays_through_the_graph_runner(webgpu, monkeypatch):
  from plugrad import Tensor
  from plugrad.engine.jit import TinyJit
  from plugrad_webgpu.graph import WebGPUGraph
  assert webgpu.graph is WebGPUGraph
  replays: list[int] = []
  real = WebGPUGraph.__call__
  def spy(self, *a, **k):
    replays.append(len(self.kernels))
    return real(self, *a, **k)
  monkeypatch.setattr(WebGPUGraph, "__call__", spy)

  @TinyJit
  def f(x, y):
    a = (x * 2 + y).relu().contiguous()
    b = (a * y).sum(0).contiguous()
    return (b + a.max(0)).realize()

  rng = np.random.default_rng(0)
  for _ in range(4):
    a, b = rng.random((16, 8), dtype=np.float32), rng.random((16, 8), dtype=np.float32)
    got = f(Tensor(a, device="WEBGPU"), Tensor(b, device="WEBGPU")).numpy()
    aa = np.maximum(a * 2 + b, 0)
    np.testing.assert_allclose(got, (aa * b).sum(0) + aa.max(0), rtol=1e-5)
  assert replays and all(n >= 2 for n in replays)  # the replays went through the graph, several kernels per submission
