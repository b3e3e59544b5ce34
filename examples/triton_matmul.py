"""A Triton kernel run by plugrad: an fp16 matmul compiled ahead of time to PTX, wrapped as a PROGRAM, run on Tensors.

    pip install triton            # the 3.x wheel: compiles for an explicit target without a GPU
    python examples/triton_matmul.py [--size 4096] [--arch 90]

1. `triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))` turns the `@triton.jit` kernel into PTX for
   sm_90a (Hopper: wgmma, TMA) — no GPU, no driver needed. M, N, K are compile-time constants (the kernel is
   specialized for the shape, as an AOT kernel is), so the kernel's parameters are the three buffers plus Triton's two
   scratch pointers, which plugrad-cuda passes as null (their sizes are 0: `plugrad_cuda/ptx.py`).
2. `plugrad.backend.new_program(name, "CUDA", source=ptx, buffers=..., global_size=..., local_size=...)` wraps it:
   plugrad-cuda's compiler sees PTX (`.version`/`.target` lines), skips NVRTC and links it with nvJitLink. Triton's
   dynamic shared memory (`metadata.shared`) travels as the line `// plugrad.shared_bytes = N` in the PTX.
3. With a GPU: `run_program(prog, c, a, b)` runs it on plugrad Tensors, the result is checked against plugrad's own
   `a @ b`, and both are timed (CUDA events). Without one it says so, compiles the PTX to a cubin for sm_90a (what the
   GPU would load) and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 128, 128, 64, 8, 3


def triton_available() -> str | None:
  """None when triton can be imported, else why not."""
  try:
    import triton  # noqa: F401
    return None
  except Exception as e: return f"triton is not installed ({type(e).__name__}: {e}); pip install triton"


def compile_ptx(m: int, n: int, k: int, arch: int = 90, block: tuple[int, int, int] = (BLOCK_M, BLOCK_N, BLOCK_K), num_warps: int = NUM_WARPS,
                num_stages: int = NUM_STAGES) -> tuple[str, dict[str, Any]]:
  """(the PTX of an fp16 C[m, n] = A[m, k] @ B[k, n] for sm_<arch>, with the plugrad.shared_bytes line; its launch facts)."""
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; fusion is its default
  import triton
  import triton.language as tl
  from triton.backends.compiler import GPUTarget
  from triton.compiler import ASTSource
  bm, bn, bk = block
  if m % bm or n % bn or k % bk: raise ValueError(f"this kernel needs M % {bm} == N % {bn} == K % {bk} == 0, got {m}x{n}x{k}")

  @triton.jit
  def matmul_f16(c_ptr, a_ptr, b_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
      acc += tl.dot(tl.load(a_ptrs), tl.load(b_ptrs))
      a_ptrs += BK
      b_ptrs += BK * N
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

  consts = {"M": m, "N": n, "K": k, "BM": bm, "BN": bn, "BK": bk}
  # constexprs are named in the signature too (Triton 3.3-3.6 want every parameter there; 3.9 accepts it)
  src = ASTSource(fn=matmul_f16, signature={"c_ptr": "*fp16", "a_ptr": "*fp16", "b_ptr": "*fp16", **{c: "constexpr" for c in consts}},
                  constexprs=consts)
  kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "num_stages": num_stages})
  md = kernel.metadata
  ptx = kernel.asm["ptx"]
  return f"// plugrad.shared_bytes = {md.shared}\n{ptx}", {"name": md.name, "shared": md.shared, "threads": md.num_warps * 32,
                                                          "grid": (m // bm, n // bn, 1)}


def make_program(ptx: str, meta: dict[str, Any], device: str = "CUDA") -> Any:
  from plugrad import dtypes
  from plugrad.backend import new_program
  f16 = dtypes.float16
  return new_program(meta["name"], device, source=ptx, buffers=[(f16, "out"), (f16, "in"), (f16, "in")], global_size=meta["grid"],
                     local_size=(meta["threads"], 1, 1))


def gpu_reason() -> str | None:
  """None when the CUDA device can run kernels here, else why not (the probe's message)."""
  from plugrad.device.registry import Device
  try:
    Device["CUDA"].runtime  # noqa: B018
    return None
  except Exception as e: return f"{type(e).__name__}: {e}"


def tflops(m: int, n: int, k: int, seconds: float) -> float: return 2 * m * n * k / seconds / 1e12


def run_on_gpu(size: int, prog: Any, reps: int = 10) -> dict[str, float]:
  """Run the Triton kernel and plugrad's matmul on CUDA; check them against each other; seconds per call of each."""
  import numpy as np

  from plugrad import Tensor, dtypes
  from plugrad.backend import run_program
  from plugrad.device.registry import Device
  rng = np.random.default_rng(0)
  a = Tensor(rng.uniform(-1, 1, (size, size)).astype(np.float16), device="CUDA").realize()
  b = Tensor(rng.uniform(-1, 1, (size, size)).astype(np.float16), device="CUDA").realize()
  c = Tensor.empty(size, size, dtype=dtypes.float16, device="CUDA").realize()
  dev = Device["CUDA"]
  def timed(fn: Any) -> float:
    fn()
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(reps): fn()
    dev.synchronize()
    return (time.perf_counter() - t) / reps
  t_triton = timed(lambda: run_program(prog, c, a, b))
  ref = (a @ b).realize()
  t_plugrad = timed(lambda: (a @ b).realize())
  got, want = c.numpy().astype(np.float32), ref.numpy().astype(np.float32)
  err = float(np.max(np.abs(got - want)))
  scale = float(np.max(np.abs(want)))
  if not np.allclose(got, want, rtol=2e-2, atol=2e-2 * scale):
    raise SystemExit(f"the Triton kernel disagrees with plugrad's matmul: max |diff| {err}")
  return {"triton": t_triton, "plugrad": t_plugrad, "max_abs_diff": err}


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--size", type=int, default=4096, help="M = N = K (a multiple of 128)")
  ap.add_argument("--arch", type=int, default=90, help="compute capability x10 to compile for (90: sm_90a)")
  a = ap.parse_args(argv)
  if (why := triton_available()) is not None:
    print(f"triton_matmul: {why}")
    return 1
  t = time.perf_counter()
  ptx, meta = compile_ptx(a.size, a.size, a.size, a.arch)
  from plugrad_cuda import ptx as ptxinfo
  print(f"triton: {meta['name']} {a.size}x{a.size}x{a.size} fp16 -> PTX for {ptxinfo.target(ptx)} ({len(ptx)} chars, {meta['threads']} threads, "
        f"{meta['shared']} B shared memory, grid {meta['grid']}) in {time.perf_counter() - t:.1f} s")
  if (why := gpu_reason()) is not None:
    from plugrad_cuda.compiler import CUDACompiler  # the compiler Device.offline("CUDA") gives with CUDA_ARCH=sm_<arch>
    cubin = CUDACompiler(f"sm_{a.arch}").compile(ptx)
    print(f"no GPU here ({why}): compiled the PTX to a {len(cubin)}-byte cubin for {ptxinfo.target(ptx)} with nvJitLink; not run")
    return 0
  prog = make_program(ptx, meta)
  r = run_on_gpu(a.size, prog)
  from plugrad.device.registry import Device
  print(f"on {Device['CUDA'].runtime.describe()}: Triton {r['triton'] * 1e3:.3f} ms ({tflops(a.size, a.size, a.size, r['triton']):.1f} TFLOPS), "
        f"plugrad a@b {r['plugrad'] * 1e3:.3f} ms ({tflops(a.size, a.size, a.size, r['plugrad']):.1f} TFLOPS); "
        f"max |diff| {r['max_abs_diff']:.3g}: they agree")
  return 0


if __name__ == "__main__":
  sys.exit(main())
