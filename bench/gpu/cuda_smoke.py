"""The CUDA driver paths, one check each, before anything else runs on a GPU (bench/gpu/cuda_check.sh's `smoke` step).

  python bench/gpu/cuda_smoke.py [--only copy_small,launch,...] [--json FILE]

Each check prints `PASS name: what it saw (ms)` or `FAIL name: the error` (a CUDAError carries the driver's
CUDA_ERROR_* name); every result is compared with numpy. Checks: copies round trip below and above the 4 MiB staging
chunk; a launch; an event-timed launch (GPU seconds from cuEventElapsedTime_v2); a TinyJit replay as a CUDA graph with
new input buffers every call (the nodes' parameters patched), then a second capture (a new graph); a graph whose
topology changes with a bound Variable (a launch of 0 blocks dropped: rebuilt); a PTX source linked
by nvJitLink; a PTX kernel with more than 48 KiB of dynamic shared memory (the opt-in); a tensor-core (mma.sync) fp16
matmul. Without a usable GPU every check says "no GPU" with the reason and the script exits 0 (nothing is measured).
Exit status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

DEV = "CUDA"
RNG = np.random.default_rng(31)


def ptx_reverse(shared_offset: int) -> tuple[str, int]:
  """(PTX of out[t] = in[255 - t] through dynamic shared memory at `shared_offset`, the shared bytes it declares) for
  one block of 256 threads: each thread stores its element, the block syncs, each reads its mirror's."""
  shared = shared_offset + 256 * 4
  src = f"""// plugrad.shared_bytes = {shared}
.version 8.0
.target sm_80
.address_size 64
.extern .shared .align 16 .b8 smem[];
.visible .entry rev256(
	.param .u64 rev256_param_0,
	.param .u64 rev256_param_1
)
{{
	.reg .b32 %r<8>;
	.reg .f32 %f<2>;
	.reg .b64 %rd<7>;
	ld.param.u64 %rd1, [rev256_param_0];
	ld.param.u64 %rd2, [rev256_param_1];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f1, [%rd4];
	mov.u32 %r2, smem;
	add.u32 %r2, %r2, {shared_offset};
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	st.shared.f32 [%r4], %f1;
	bar.sync 0;
	sub.u32 %r5, 255, %r1;
	shl.b32 %r6, %r5, 2;
	add.u32 %r7, %r2, %r6;
	ld.shared.f32 %f1, [%r7];
	add.s64 %rd5, %rd1, %rd3;
	st.global.f32 [%rd5], %f1;
	ret;
}}
"""
  return src, shared


# out[i] = a[i] + b[i] for i < n, one thread per element (the libcuda stand-in of plugins/cuda/tests runs a kernel of
# this name and parameters itself, so this check also runs in CI without a GPU: tests/gpu/test_gpu_checks.py)
ADD_N_PTX = """.version 8.0
.target sm_80
.address_size 64
.visible .entry pg_add_n(
	.param .u64 pg_add_n_param_0,
	.param .u64 pg_add_n_param_1,
	.param .u64 pg_add_n_param_2,
	.param .u32 pg_add_n_param_3
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<11>;
	ld.param.u64 %rd1, [pg_add_n_param_0];
	ld.param.u64 %rd2, [pg_add_n_param_1];
	ld.param.u64 %rd3, [pg_add_n_param_2];
	ld.param.u32 %r1, [pg_add_n_param_3];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.s32 %p1, %r5, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd4, %rd1;
	cvta.to.global.u64 %rd5, %rd2;
	cvta.to.global.u64 %rd6, %rd3;
	mul.wide.s32 %rd7, %r5, 4;
	add.s64 %rd8, %rd5, %rd7;
	ld.global.f32 %f1, [%rd8];
	add.s64 %rd9, %rd6, %rd7;
	ld.global.f32 %f2, [%rd9];
	add.f32 %f3, %f1, %f2;
	add.s64 %rd10, %rd4, %rd7;
	st.global.f32 [%rd10], %f3;
DONE:
	ret;
}
"""


def _tensor(x: np.ndarray) -> Any:
  from plugrad import Tensor
  return Tensor(x, device=DEV).realize()


def _same(got: np.ndarray, want: np.ndarray, rtol: float = 0.0, atol: float = 0.0) -> None:
  if rtol or atol: np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
  else: np.testing.assert_array_equal(got, want)


def check_copy(n: int) -> str:
  x = RNG.standard_normal(n).astype(np.float32)
  _same(_tensor(x).numpy(), x)
  return f"{x.nbytes} bytes in and out"


def check_launch() -> str:
  a, b = RNG.standard_normal(100_003).astype(np.float32), RNG.standard_normal(100_003).astype(np.float32)
  _same((_tensor(a) * 2 + _tensor(b)).numpy(), a * 2 + b, rtol=1e-6, atol=1e-6)
  return "a*2+b on 100003 elements"


def check_event_timed() -> str:
  from plugrad.engine.realize import capture
  a = _tensor(RNG.standard_normal(1 << 22).astype(np.float32))
  with capture() as items: out = (a * a).realize()
  kernels = [ei for ei in items if ei.runner is not None]
  if len(kernels) != 1: raise RuntimeError(f"expected one kernel, captured {[ei.name for ei in items]}")
  secs = [kernels[0].run(wait=True) for _ in range(5)]
  if not all(isinstance(s, float) and 0 < s < 1 for s in secs): raise RuntimeError(f"event times {secs} (seconds) are not in (0, 1)")
  _same(out.numpy(), a.numpy() ** 2, rtol=1e-6)
  s = sorted(secs)[2]
  return f"{kernels[0].name}: {s * 1e6:.1f} us by events (16 MiB read + write: {2 * (1 << 24) / s / 1e9:.0f} GB/s)"


def check_graph() -> str:
  from plugrad import Tensor, TinyJit
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    z = (x * y + 1).contiguous()
    return (z.relu() * x - y).contiguous() + 0.5
  def want(x: np.ndarray, y: np.ndarray) -> np.ndarray: return np.maximum(x * y + 1, 0) * x - y + 0.5
  def calls(n: int, size: int) -> None:
    for _ in range(n):  # new input buffers on every call: a replay patches the nodes' parameters
      x, y = RNG.standard_normal(size).astype(np.float32), RNG.standard_normal(size).astype(np.float32)
      _same(step(_tensor(x), _tensor(y)).numpy(), want(x, y), rtol=1e-5, atol=1e-6)
  calls(5, 4096)
  graphs = [s for s in step.captured.steps if hasattr(s, "rebuilds")]
  if not graphs: raise RuntimeError(f"no CUDA graph in the capture: {[type(s).__name__ for s in step.captured.steps]}")
  first = f"{len(graphs)} graph(s), {sum(len(g.nodes) for g in graphs)} nodes"
  step.reset()  # a second capture of other sizes: a new graph built and instantiated
  calls(4, 1000)
  regraphs = [s for s in step.captured.steps if hasattr(s, "rebuilds")]
  if not regraphs or regraphs[0] is graphs[0]: raise RuntimeError("the second capture did not build a new graph")
  return f"{first}; 5 calls then a new capture ({sum(g.rebuilds for g in regraphs)} instantiation), all match numpy"


def check_graph_rebuild() -> str:
  """A TinyJit of two launches of ADD_N_PTX, the second sized by a bound Variable: replays with new input buffers patch
  the nodes; n = 0 drops the second node (CUDA cannot launch an empty grid), a new topology, so the graph is built
  and instantiated again, and again when n comes back."""
  from plugrad import Tensor, TinyJit, Variable
  from plugrad.backend import new_program, run_program
  from plugrad.dtype import dtypes
  f32 = dtypes.float32
  def program(v: Any) -> Any:  # one per variable: a TinyJit argument's value is looked up by the variable's name
    return new_program("pg_add_n", DEV, source=ADD_N_PTX, buffers=[(f32, "out"), (f32, "in"), (f32, "in")], global_size=((v + 255) // 256,),
                       local_size=(256,), vars=[v])
  m, n = Variable("m", 1, 1024), Variable("n", 0, 1024)
  add_m, add_n = program(m), program(n)
  @TinyJit
  def step(x: Tensor, y: Tensor, k: Any) -> Tensor:
    mid = Tensor.empty(1024, device=DEV)
    run_program(add_m, mid, x, y, m=1024)  # bound inside: it keeps its captured value
    out = Tensor.empty(1024, device=DEV)
    run_program(add_n, out, mid, x, n=k)
    return out
  seen = []
  for k in (1024, 1024, 1024, 300, 0, 700):
    x, y = RNG.standard_normal(1024).astype(np.float32), RNG.standard_normal(1024).astype(np.float32)
    got = step(_tensor(x), _tensor(y), n.bind(k)).numpy()
    _same(got[:k], (x + y + x)[:k], rtol=1e-6, atol=1e-6)
    graphs = [s for s in step.captured.steps if hasattr(s, "rebuilds")] if step.captured is not None else []
    seen.append(tuple((len(g.nodes), g.rebuilds) for g in graphs))
  want = [(), ((0, 0),), ((2, 1),), ((2, 1),), ((1, 2),), ((2, 3),)]  # captured on the 2nd call, built on the 3rd
  if seen != want: raise RuntimeError(f"(nodes, instantiations) per call {seen}, expected {want}")
  return "patched replays, n = 0 drops a node (rebuilt), n = 700 brings it back (rebuilt); every output matches numpy"


def check_ptx(offset: int) -> str:
  from plugrad import Tensor
  from plugrad.backend import new_program, run_program
  from plugrad.dtype import dtypes
  src, shared = ptx_reverse(offset)
  prog = new_program("rev256", DEV, source=src, buffers=[(dtypes.float32, "out"), (dtypes.float32, "in")], global_size=(1,), local_size=(256,))
  x = RNG.standard_normal(256).astype(np.float32)
  out = Tensor.empty(256, device=DEV).realize()
  run_program(prog, out, _tensor(x))
  _same(out.numpy(), x[::-1])
  return f"PTX linked by nvJitLink, {shared} bytes of dynamic shared memory"


def check_tensor_core() -> str:
  from plugrad.codegen import get_program
  from plugrad.device.registry import Device
  from plugrad.engine.schedule import create_schedule
  a = RNG.uniform(-1, 1, (256, 256)).astype(np.float16)
  b = RNG.uniform(-1, 1, (256, 256)).astype(np.float16)
  ta, tb = _tensor(a), _tensor(b)
  got = (ta @ tb).numpy().astype(np.float32)
  want = a.astype(np.float32) @ b.astype(np.float32)
  err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
  items, _ = create_schedule((ta @ tb).uop)
  progs = [get_program(it.ast, Device[DEV].renderer) for it in items if it.kind == "kernel"]
  opts = [o.op.name for p in progs for o in p.applied_opts]
  if "TC" not in opts: raise RuntimeError(f"the matmul did not use tensor cores: {[p.name for p in progs]} with {opts}")
  if "mma.sync" not in "".join(p.source for p in progs): raise RuntimeError("no mma.sync in the kernel's source")
  if err > 1e-2: raise RuntimeError(f"relative error {err:.2e} vs numpy (fp32 accumulation expected: < 1e-2)")
  return f"256^3 fp16 by mma.sync, relative error {err:.1e} vs numpy"


CHECKS: dict[str, Callable[[], str]] = {
  "copy_small": lambda: check_copy(1000),
  "copy_large": lambda: check_copy((9 << 20) // 4 + 3),  # 9 MiB + 12 bytes: three staging chunks, the last partial
  "launch": check_launch,
  "event_timed": check_event_timed,
  "graph": check_graph,
  "graph_rebuild": check_graph_rebuild,
  "ptx": lambda: check_ptx(0),
  "shared_48k": lambda: check_ptx(64 << 10),
  "tensor_core": check_tensor_core,
}


def cuda_error_name(e: BaseException) -> str:
  """The driver's CUDA_ERROR_* name of a CUDAError in `e`'s chain (the core wraps a failed launch in a LaunchError)."""
  seen: BaseException | None = e
  while seen is not None:
    if isinstance(name := getattr(seen, "name", None), str) and name.startswith("CUDA_ERROR"): return name
    seen = seen.__cause__ or seen.__context__
  m = re.search(r"\bCUDA_ERROR_\w+", str(e))
  return m.group(0) if m else ""


def error_text(e: BaseException) -> str:
  name = cuda_error_name(e)
  first = (str(e).strip().splitlines() or [""])[0]
  return f"{type(e).__name__}{f' [{name}]' if name else ''}: {first}"[:400]


def no_gpu_reason() -> str | None:
  try:
    from plugrad_cuda import driver
  except ImportError as e: return f"plugrad-cuda is not importable ({e})"
  return driver.probe()


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--only", default="", help=f"comma-separated checks (default all: {','.join(CHECKS)})")
  ap.add_argument("--json", default="", help="write the results here")
  args = ap.parse_args(argv)
  names = [n for n in args.only.split(",") if n] or list(CHECKS)
  if bad := [n for n in names if n not in CHECKS]: ap.error(f"unknown checks {bad}; choose from {list(CHECKS)}")
  results: dict[str, dict[str, Any]] = {}
  if (why := no_gpu_reason()) is not None:
    for n in names:
      print(f"no GPU  {n}: {why}")
      results[n] = {"status": "no GPU", "why": why}
  else:
    from plugrad.device.registry import Device
    print(f"GPU: {Device[DEV].runtime.describe()}", flush=True)
    for n in names:
      t = time.perf_counter()
      try: results[n] = {"status": "PASS", "detail": CHECKS[n]()}
      except Exception as e:
        results[n] = {"status": "FAIL", "error": error_text(e), "trace": traceback.format_exc()[-3000:]}
      results[n]["ms"] = round((time.perf_counter() - t) * 1e3, 1)
      r = results[n]
      print(f"{r['status']}  {n}: {r.get('detail') or r.get('error')} ({r['ms']:.0f} ms)", flush=True)
  if args.json:
    with open(args.json, "w") as f: json.dump(results, f, indent=1)
  failed = [n for n, r in results.items() if r["status"] == "FAIL"]
  if why: print(f"smoke: none of the {len(results)} checks ran (no GPU)")
  else: print(f"smoke: {len(results) - len(failed)} of {len(results)} passed" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
