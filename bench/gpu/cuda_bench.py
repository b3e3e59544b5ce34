"""CUDA throughput: plugrad's CUDA device next to PyTorch (cuBLAS and its own kernels, CUDA graphs) and a Triton kernel
run through plugrad, one line per workload (run by bench/gpu/cuda_check.sh on a GPU machine).

  python bench/gpu/cuda_bench.py [--quick] [--only mm16,ew,...] [--cap SECONDS] [--budget SECONDS] [--json FILE]
  python bench/gpu/cuda_bench.py --dry     # no GPU: plugrad's side at toy sizes on the PYTHON device under EMULATE=CUDA (CI)

Workloads (--only picks them by key):
  mm16       matmul fp16 4096^3 (fp32 accumulation), TFLOPS (2N^3 flops): plugrad `a @ b` (tensor cores by its default
             heuristics), torch `a @ b` (cuBLAS), and examples/triton_matmul.py's Triton kernel compiled ahead of time to
             PTX for the GPU's arch and run on plugrad Tensors by `run_program` (the third column)
  mm32       matmul fp32 4096^3, TFLOPS: plugrad, torch with TF32 off (cuBLAS SGEMM: the same IEEE fp32 arithmetic; the
             Triton kernel is fp16 only)
  ew         fused elementwise a*b+c on 256M fp32 (2^28), GB/s (16 bytes per element: 3 reads + 1 write), next to torch's
             `addcmul` (one kernel) and the H200's HBM3e peak, 4.8 TB/s (NVIDIA's datasheet figure, not a measurement)
  softmax    softmax over the rows of a 16384x4096 fp32 matrix, GB/s (8 bytes per element: one read + one write)
  layernorm  layernorm (no affine) over the rows of 16384x4096 fp32, GB/s (same count)
  replay     TinyJit replay of a 16-kernel chain (a CUDA graph), microseconds per kernel, next to a PyTorch CUDA graph
             of the same chain (bench/gpu/cuda_replay.py)
  cnn        the main job's training step (examples/train_digits.py's DigitsCNN, batch 128 of 1x8x8, Adam, label
             smoothing) on DEV=CUDA under TinyJit, ms per step, next to the same model in eager PyTorch on the GPU

How it measures. Every workload runs in a worker process of its own (this script with --worker), with all of its
frameworks in that one process (plugrad, then torch/cuBLAS, then Triton), so a fault that poisons a CUDA context (an
illegal address) costs one line, not the run, and each worker is killed after --cap seconds ("timeout"). In a worker:
inputs from numpy's default_rng (the same seed for every framework), copied to the GPU once; warm-up runs (compiles,
captures) excluded; then timed runs, each launched and synchronized (`Device["CUDA"].synchronize()` /
`torch.cuda.synchronize()`), until they add up to 0.3 s (at least 3, at most 50); the median is reported as the host
time. The device time is the GPU's own, by CUDA events: for plugrad the sum of the run's kernels (or graph launches),
each timed by events around its launch (plugrad's timeline tracing, which makes every launch wait and time itself);
for torch events recorded on its stream around the run. Rates are given for both ("host" includes Python and launch
overhead; "dev" is what the GPU took). Each result is checked once against a float64 numpy reference on sampled rows
(max abs error / max abs reference); the replay's output against the same chain in numpy. The ratio (x) is
plugrad/peer for rates and peer/plugrad for times: above 1, plugrad is faster.

The figures are the GPU's own: this script prints the GPU's name first. Without a GPU it says so and exits 1; the
figures are then unmeasured (never estimated).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HBM_GBPS = 4800.0  # H200 HBM3e, NVIDIA's datasheet (the reference line; not measured)
MIN_TIMED, MAX_REPS = 0.3, 50

SIZES = {  # per profile: matmul N, elementwise elements, (rows, cols) of softmax/layernorm, CNN batch
  "full": {"mm": 4096, "ew": 1 << 28, "rows": (16384, 4096), "batch": 128},
  "quick": {"mm": 2048, "ew": 1 << 26, "rows": (8192, 2048), "batch": 128},
  "dry": {"mm": 64, "ew": 4096, "rows": (8, 256), "batch": 4},
}
# key: (label, unit, higher is better, frameworks in order); run in this order (the targets first, so a run cut
# short by --budget still has them)
WORKLOADS: dict[str, tuple[str, str, bool, tuple[str, ...]]] = {
  "mm16": ("matmul fp16 {mm}^3", "TFLOPS", True, ("plugrad", "torch", "triton")),
  "ew": ("a*b+c {ew_m}M fp32", "GB/s", True, ("plugrad", "torch")),
  "replay": ("TinyJit replay, 16-kernel chain", "us/kernel", False, ("plugrad", "torch")),
  "mm32": ("matmul fp32 {mm}^3", "TFLOPS", True, ("plugrad", "torch")),
  "softmax": ("softmax {r}x{c} fp32", "GB/s", True, ("plugrad", "torch")),
  "layernorm": ("layernorm {r}x{c} fp32", "GB/s", True, ("plugrad", "torch")),
  "cnn": ("digits CNN train step b{batch}", "ms/step", False, ("plugrad", "torch")),
}
PEER_NAMES = {"torch": {"mm16": "torch (cuBLAS)", "mm32": "torch (cuBLAS, no TF32)", "ew": "torch addcmul", "replay": "torch CUDA graph",
                        "cnn": "torch eager"}, "triton": {"mm16": "Triton via run_program"}}


# ------------------------------------------------------------------------------------------------ measuring (workers)

def timed(fn: Callable[[], Any], sync: Callable[[], None], warmup: int = 2) -> list[float]:
  for _ in range(warmup):
    fn()
    sync()
  times: list[float] = []
  while len(times) < 3 or (sum(times) < MIN_TIMED and len(times) < MAX_REPS):
    t = time.perf_counter()
    fn()
    sync()
    times.append(time.perf_counter() - t)
  return times


def plugrad_device_seconds(fn: Callable[[], Any], reps: int = 5) -> float | None:
  """Median over `reps` runs of the GPU seconds of fn's launches, each timed by CUDA events (trace's timeline makes
  every kernel launch and graph replay wait and time itself); None when nothing was launched."""
  from plugrad import trace
  sums = []
  for _ in range(reps):
    trace.enable(graphs=True)
    try: fn()
    finally: got = trace.disable()
    launches = [x.seconds for x in (got.launches if got is not None else []) if x.kind in ("kernel", "graph")]
    if launches: sums.append(sum(launches))
  return statistics.median(sums) if sums else None


def torch_device_seconds(fn: Callable[[], Any], reps: int = 5) -> float:
  """Median GPU seconds of fn by torch.cuda events around it on the current stream."""
  import torch
  out = []
  for _ in range(reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    out.append(start.elapsed_time(end) / 1e3)
  return statistics.median(out)


def inputs(key: str, sz: dict[str, Any], seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  if key in ("mm16", "mm32"):
    dt = np.float16 if key == "mm16" else np.float32
    return [rng.uniform(-1, 1, (sz["mm"], sz["mm"])).astype(dt) for _ in range(2)]
  if key == "ew": return [rng.random(sz["ew"], dtype=np.float32) for _ in range(3)]
  if key in ("softmax", "layernorm"): return [rng.standard_normal(sz["rows"], dtype=np.float32)]
  return []


def sample_rows(n: int, k: int = 16) -> np.ndarray: return np.unique(np.linspace(0, n - 1, min(n, k)).astype(int))


def relerr(key: str, xs: list[np.ndarray], out: np.ndarray) -> float:
  """max |out - reference| / max |reference| on sampled rows (float64 numpy reference)."""
  if key in ("mm16", "mm32"):
    rows = sample_rows(xs[0].shape[0])
    ref = xs[0][rows].astype(np.float64) @ xs[1].astype(np.float64)
    got = out[rows]
  elif key == "ew":
    idx = np.concatenate([np.arange(min(len(xs[0]), 1 << 16)), np.arange(max(0, len(xs[0]) - 1024), len(xs[0]))])
    ref = xs[0][idx].astype(np.float64) * xs[1][idx] + xs[2][idx]
    got = out[idx]
  elif key in ("softmax", "layernorm"):
    rows = sample_rows(xs[0].shape[0])
    x = xs[0][rows].astype(np.float64)
    if key == "softmax":
      e = np.exp(x - x.max(-1, keepdims=True))
      ref = e / e.sum(-1, keepdims=True)
    else: ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    got = out[rows]
  else: return 0.0
  return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def work(key: str, sz: dict[str, Any]) -> float:
  """Flops (matmul) or bytes (memory-bound) of one run."""
  if key in ("mm16", "mm32"): return 2.0 * sz["mm"] ** 3
  if key == "ew": return 16.0 * sz["ew"]
  if key in ("softmax", "layernorm"): return 8.0 * sz["rows"][0] * sz["rows"][1]
  return 1.0


def rate(key: str, sz: dict[str, Any], seconds: float) -> float:
  unit = WORKLOADS[key][1]
  if unit == "TFLOPS": return work(key, sz) / seconds / 1e12
  if unit == "GB/s": return work(key, sz) / seconds / 1e9
  return seconds


def device_value(key: str, sz: dict[str, Any], seconds: float) -> float:
  """The workload's figure in its unit from GPU seconds (per run; per kernel for the replay)."""
  unit = WORKLOADS[key][1]
  return seconds * 1e6 if unit == "us/kernel" else seconds * 1e3 if unit == "ms/step" else rate(key, sz, seconds)


def plugrad_worker(key: str, fw: str, sz: dict[str, Any], device: str) -> dict[str, Any]:
  from plugrad import Device, Tensor, TinyJit, dtypes
  Device.DEFAULT = device  # the CNN's parameters are created on the default device
  dev = Device[device]
  sync = dev.synchronize
  xs = inputs(key, sz)
  ts = [Tensor(x, device=device).realize() for x in xs]
  out: dict[str, Any] = {"device": dev.runtime.describe() if hasattr(dev.runtime, "describe") else device}
  if key in ("mm16", "mm32") and fw == "triton":
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import triton_matmul as tm
    arch = int(dev.renderer.arch.removeprefix("sm_").rstrip("a"))
    ptx, meta = tm.compile_ptx(sz["mm"], sz["mm"], sz["mm"], arch)
    prog = tm.make_program(ptx, meta, device)
    from plugrad.backend import run_program
    c = Tensor.empty(sz["mm"], sz["mm"], dtype=dtypes.float16, device=device).realize()
    times = timed(lambda: run_program(prog, c, *ts), sync)
    out["device_s"] = plugrad_device_seconds(lambda: run_program(prog, c, *ts))
    res = c.numpy()
    out.update(triton_shared=meta["shared"], ptx_target=ptx.split(".target", 1)[1].split()[0])
  elif key in ("mm16", "mm32", "ew", "softmax", "layernorm"):
    fn: Callable[[], Tensor] = {"mm16": lambda: ts[0] @ ts[1], "mm32": lambda: ts[0] @ ts[1], "ew": lambda: ts[0] * ts[1] + ts[2],
                                "softmax": lambda: ts[0].softmax(-1), "layernorm": lambda: ts[0].layernorm()}[key]
    last: list[Tensor] = []
    def run() -> None: last[:] = [fn().realize()]
    times = timed(run, sync)
    out["device_s"] = plugrad_device_seconds(run)
    res = last[0].numpy()
    from plugrad.codegen import get_program
    from plugrad.engine.schedule import create_schedule
    items, _ = create_schedule(fn().uop)
    progs = [get_program(it.ast, dev.renderer) for it in items if it.kind == "kernel"]
    out["kernels"] = [f"{p.name} {[(o.op.name, o.axis, o.amount) for o in p.applied_opts]}" for p in progs]
  elif key == "replay":
    sys.path.insert(0, HERE)
    import cuda_replay
    r = cuda_replay.time_plugrad(device, reps=50 if sz is SIZES["dry"] else cuda_replay.R)
    dev_us = r["device_us"]
    return {**out, "value": r["us"] / cuda_replay.K, "graphs": r["graphs"], "times": [r["us"] * 1e-6], "relerr": r["relerr"],
            "device_s": None if dev_us is None else dev_us * 1e-6 / cuda_replay.K}
  elif key == "cnn":
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from train_digits import DigitsCNN

    from plugrad.nn import get_parameters
    from plugrad.nn.optim import Adam
    rng = np.random.default_rng(0)
    Tensor.manual_seed(0)
    Tensor.training = True
    model = DigitsCNN()
    opt = Adam(get_parameters(model), lr=1e-2)
    xb = Tensor(rng.random((sz["batch"], 1, 8, 8), dtype=np.float32), device=device).realize()
    yb = Tensor(rng.integers(0, 10, sz["batch"]).astype(np.int32), device=device).realize()
    @TinyJit
    def step() -> Tensor:
      opt.zero_grad()
      loss = model(xb).sparse_categorical_crossentropy(yb, label_smoothing=0.1)
      loss.backward()
      return loss.realize(*opt.schedule_step())
    losses: list[Tensor] = []
    times = timed(lambda: losses.append(step()), sync, warmup=3)  # TinyJit captures on the second call
    out["device_s"] = plugrad_device_seconds(step)
    loss = float(losses[-1].numpy())
    if not np.isfinite(loss): raise RuntimeError(f"the loss is {loss}")
    return {**out, "value": statistics.median(times) * 1e3, "times": times, "loss": loss, "relerr": 0.0}
  else: raise ValueError(f"no plugrad workload {key!r}")
  med = statistics.median(times)
  return {**out, "value": rate(key, sz, med), "times": times, "relerr": relerr(key, xs, res.astype(np.float32))}


def torch_worker(key: str, sz: dict[str, Any]) -> dict[str, Any]:
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  sync = torch.cuda.synchronize
  out: dict[str, Any] = {"device": f"{torch.cuda.get_device_name()} (torch {torch.__version__})"}
  xs = inputs(key, sz)
  ts = [torch.from_numpy(x).cuda() for x in xs]
  if key in ("mm16", "mm32", "ew", "softmax", "layernorm"):
    fn = {"mm16": lambda: ts[0] @ ts[1], "mm32": lambda: ts[0] @ ts[1], "ew": lambda: torch.addcmul(ts[2], ts[0], ts[1]),
          "softmax": lambda: torch.softmax(ts[0], -1), "layernorm": lambda: torch.nn.functional.layer_norm(ts[0], ts[0].shape[-1:])}[key]
    last: list[Any] = []
    def run() -> None: last[:] = [fn()]
    times = timed(run, sync)
    out["device_s"] = torch_device_seconds(run)
    res = last[0].float().cpu().numpy()
    return {**out, "value": rate(key, sz, statistics.median(times)), "times": times, "relerr": relerr(key, xs, res)}
  if key == "replay":
    sys.path.insert(0, HERE)
    import cuda_replay
    us, dev_us = cuda_replay.time_torch()
    return {**out, "value": us / (2 * cuda_replay.K), "times": [us * 1e-6], "device_s": dev_us * 1e-6 / (2 * cuda_replay.K),
            "note": f"{2 * cuda_replay.K} kernels per step (mul, add)"}
  if key == "cnn":
    from torch import nn
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10)).cuda()
    opt = torch.optim.Adam(cnn.parameters(), lr=1e-2)
    xb = torch.from_numpy(rng.random((sz["batch"], 1, 8, 8), dtype=np.float32)).cuda()
    yb = torch.from_numpy(rng.integers(0, 10, sz["batch"])).long().cuda()
    def step() -> None:
      opt.zero_grad()
      nn.functional.cross_entropy(cnn(xb), yb, label_smoothing=0.1).backward()
      opt.step()
    times = timed(step, sync, warmup=3)
    out["device_s"] = torch_device_seconds(step)
    return {**out, "value": statistics.median(times) * 1e3, "times": times, "relerr": 0.0}
  raise ValueError(f"no torch workload {key!r}")


def worker(args: argparse.Namespace) -> None:
  """Every framework of one workload in this one process; one RESULT line per framework as it finishes."""
  sz = SIZES[args.profile]
  for fw in args.framework.split(","):
    try: res = torch_worker(args.worker, sz) if fw == "torch" else plugrad_worker(args.worker, fw, sz, args.device)
    except Exception as e:
      import traceback
      traceback.print_exc()
      res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    if (dev := res.get("device_s")) and "value" in res: res["device_value"] = device_value(args.worker, sz, dev)
    print("RESULT " + json.dumps({"framework": fw, **res}), flush=True)


# ------------------------------------------------------------------------------------------------ the parent

def gpu_reason() -> str | None:
  """None when plugrad's CUDA device can run here, else why not."""
  try:
    from plugrad.device.registry import Device
    Device["CUDA"].runtime  # noqa: B018
    return None
  except Exception as e: return f"{type(e).__name__}: {e}"


def run_worker(key: str, fws: tuple[str, ...], profile: str, device: str, cap: float) -> dict[str, dict[str, Any]]:
  """{framework: result} of one worker process running the workload for each of `fws` in turn."""
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", key, "--framework", ",".join(fws), "--profile", profile, "--device", device]
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  if device == "PYTHON": env["EMULATE"] = "CUDA"  # the dry run's kernels are lowered as for CUDA (tensor cores included)
  t = time.perf_counter()
  stdout, stderr, why = "", "", ""
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, env=env, cwd=ROOT)
    stdout, stderr, why = p.stdout, p.stderr, f"worker exited {p.returncode}"
  except subprocess.TimeoutExpired as e:  # the frameworks that finished before the cap still count
    stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    why = f"timeout (over {cap:.0f} s)"
  out: dict[str, dict[str, Any]] = {}
  for ln in stdout.splitlines():
    if ln.startswith("RESULT "):
      res = json.loads(ln[len("RESULT "):])
      out[res.pop("framework")] = res
  wall = time.perf_counter() - t
  for fw in fws:
    if fw not in out:
      tail = (stderr.strip().splitlines() or ["no output"])[-1]
      out[fw] = {"error": f"{why}: {tail}"[:300]}
    out[fw]["wall"] = wall
    if out[fw].get("error") and stderr: out[fw]["log"] = stderr[-2000:]
  return out


def fmt(v: float) -> str: return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def label(key: str, sz: dict[str, Any]) -> str:
  return WORKLOADS[key][0].format(mm=sz["mm"], ew_m=sz["ew"] >> 20 if sz["ew"] >= 1 << 20 else f"{sz['ew'] / (1 << 20):.3g}", r=sz["rows"][0],
                                  c=sz["rows"][1], batch=sz["batch"])


def report(results: dict[str, dict[str, dict[str, Any]]], sz: dict[str, Any], dry: bool = False) -> list[str]:
  lines = ["Each line: the workload, then each framework's median host figure, [dev: the same from the GPU's CUDA-event time]; "
           "(x) = plugrad/peer for rates, peer/plugrad for times: above 1, plugrad is faster."]
  problems = []
  for key, row in results.items():
    name, unit, higher, fws = WORKLOADS[key]
    p = row.get("plugrad", {}).get("value")
    parts = []
    for fw in fws:
      if fw not in row: continue
      r = row[fw]
      who = "plugrad" if fw == "plugrad" else PEER_NAMES.get(fw, {}).get(key, fw)
      if "error" in r:
        parts.append(f"{who} n/a")
        problems.append(f"{label(key, sz)}: {who}: {r['error']}")
        continue
      v, dv, dp = r["value"], r.get("device_value"), row.get("plugrad", {}).get("device_value")
      ratio = "" if fw == "plugrad" or not p else f" ({(p / v if higher else v / p):.3g}x"
      if ratio and dv and dp: ratio += f"; dev {(dp / dv if higher else dv / dp):.3g}x"
      parts.append(f"{who} {fmt(v)}" + (f" [dev {fmt(dv)}]" if dv else "") + (ratio + ")" if ratio else ""))
      if key == "replay" and fw == "plugrad": parts[-1] += f" ({r.get('graphs', 0)} CUDA graph(s))"
      if r.get("relerr", 0.0) > (2e-2 if key == "mm16" else 1e-3):
        problems.append(f"MISMATCH {label(key, sz)}: {who} relative error {r['relerr']:.2e} (vs float64 numpy)")
    if key == "ew" and p and not dry:
      dp = row.get("plugrad", {}).get("device_value")
      parts.append(f"HBM peak {HBM_GBPS:.0f} (datasheet) ({p / HBM_GBPS:.3g}x" + (f"; dev {dp / HBM_GBPS:.3g}x)" if dp else ")"))
    lines.append(f"{label(key, sz):34s} {unit:9s} " + " | ".join(parts))
  kern = [f"  {k}: {' ; '.join(r['plugrad']['kernels'])}" for k, r in results.items() if r.get("plugrad", {}).get("kernels")]
  if kern: lines += ["plugrad's kernels (name, the default heuristics' actions):", *kern]
  # the targets, read off the lines above
  def val(k: str, fw: str) -> float | None: return results.get(k, {}).get(fw, {}).get("value")
  checks = []
  def dval(k: str, fw: str) -> float | None: return results.get(k, {}).get(fw, {}).get("device_value") or val(k, fw)
  if (p := dval("mm16", "plugrad")) and (t := dval("mm16", "torch")): checks.append(f"fp16 matmul {p / t:.2f}x cuBLAS by device time (target >= 0.7)")
  if (p := dval("ew", "plugrad")): checks.append(f"elementwise {p / HBM_GBPS:.2f}x HBM peak by device time (target >= 0.85)")
  if (p := val("replay", "plugrad")): checks.append(f"replay {p:.2f} us/kernel (target <= 2)")
  if checks and not dry: lines.append("targets (issue 16): " + "; ".join(checks))
  lines += [f"  ! {x}" for x in problems]
  return lines


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="smaller sizes (matmul 2048, 64M elements)")
  ap.add_argument("--dry", action="store_true", help="no GPU: plugrad's workloads at toy sizes on the PYTHON device")
  ap.add_argument("--only", default="", help="comma-separated workload keys")
  ap.add_argument("--cap", type=float, default=60.0, help="seconds per worker (one workload, all its frameworks) before it is killed")
  ap.add_argument("--budget", type=float, default=0.0, help="seconds for the whole run: no worker starts (or runs) past it")
  ap.add_argument("--json", default="", help="write the raw results here")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--framework", default="plugrad", help=argparse.SUPPRESS)
  ap.add_argument("--profile", default="full", help=argparse.SUPPRESS)
  ap.add_argument("--device", default="CUDA", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    worker(args)
    return 0
  keys = [k for k in (args.only.split(",") if args.only else WORKLOADS) if k]
  if bad := [k for k in keys if k not in WORKLOADS]: ap.error(f"unknown workloads {bad}; choose from {list(WORKLOADS)}")
  profile = "dry" if args.dry else "quick" if args.quick else "full"
  sz, device = SIZES[profile], "PYTHON" if args.dry else "CUDA"
  if not args.dry and (why := gpu_reason()) is not None:
    print(f"cuda_bench: no usable NVIDIA GPU here ({why}).\nNothing was measured: the CUDA figures are unmeasured "
          "(run this on a GPU machine: bench/gpu/cuda_check.sh; --dry checks the plugrad side on the PYTHON device).")
    return 1
  t0 = time.perf_counter()
  head = "dry run on PYTHON (toy sizes; no figures)" if args.dry else "GPU"
  print(f"plugrad CUDA benchmark, {head}, profile {profile}", flush=True)
  results: dict[str, dict[str, dict[str, Any]]] = {}
  for key in keys:
    fws = ("plugrad",) if args.dry else WORKLOADS[key][3]
    left = args.budget - (time.perf_counter() - t0) if args.budget else args.cap
    skipped: dict[str, Any] = {"error": f"skipped: the --budget of {args.budget:.0f} s is spent"}
    row = run_worker(key, fws, profile, device, min(args.cap, left)) if left >= 10 else {fw: dict(skipped) for fw in fws}
    results[key] = row
    for fw, res in row.items():
      if "device" in res and "GPU" in head and fw == "plugrad": head = res["device"]
      dev = f", dev {fmt(res['device_value'])}" if res.get("device_value") else ""
      status = res.get("error") or f"{fmt(res['value'])} {WORKLOADS[key][1]}{dev} ({res.get('wall', 0):.0f} s)"
      print(f"  {key:9s} {fw:8s} {status}", flush=True)
  if not args.dry:
    devs = {r["device"] for row in results.values() for r in row.values() if "device" in r}
    print("GPU: " + " / ".join(sorted(devs)))
  for line in report(results, sz, args.dry): print(line)
  if args.json:
    with open(args.json, "w") as f: json.dump({"profile": profile, "sizes": sz, "results": results}, f, indent=1, default=str)
  print(f"total {time.perf_counter() - t0:.0f} s")
  return 1 if any("error" in r for row in results.values() for r in row.values()) else 0


if __name__ == "__main__":
  sys.exit(main())
