"""Runs an exported model.js's plan through wgpu-py the way model.js does in a browser: the same buffers, bind group
layouts, uniforms, dispatch sizes and weights file, on its own adapter and device (not plugrad's). Imports no plugrad
module except the plan reader and the size evaluator of plugrad.export (plain data functions)."""
from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from plugrad.export.common import sym_eval
from plugrad.export.webgpu import read_plan


def padded(n: int) -> int: return max(4, (n + 3) & ~3)


def read_safetensors(path: Path) -> dict[str, bytes]:
  raw = path.read_bytes()
  n = struct.unpack("<Q", raw[:8])[0]
  header = json.loads(raw[8:8 + n])
  return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def run_plan(out_dir: Path, inputs: list[bytes], vars: dict[str, int] | None = None) -> list[bytes]:
  import wgpu
  plan: dict[str, Any] = read_plan((out_dir / "model.js").read_text())
  adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
  limits = {re.sub(r"([A-Z])", r"-\1", k).lower(): v for k, v in plan["limits"].items()}  # maxBufferSize -> max-buffer-size
  for k, v in limits.items(): assert adapter.limits[k] >= v, f"the adapter offers {k} = {adapter.limits[k]}, the kernels need {v}"
  dev = adapter.request_device_sync(required_features=plan["features"], required_limits=limits)
  usage = wgpu.BufferUsage
  weights = read_safetensors(out_dir / plan["weights"])
  bufs = [dev.create_buffer(size=padded(b["bytes"]), usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST) for b in plan["buffers"]]
  for i, b in enumerate(plan["buffers"]):
    if b["kind"] == "weight":
      data = weights[b["name"]]
      assert len(data) == b["bytes"]
      dev.queue.write_buffer(bufs[i], 0, data + b"\0" * (padded(len(data)) - len(data)))
  shaders = []
  for s in plan["shaders"]:
    entries: list[dict[str, Any]] = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}}
                                     for i in range(s["buffers"])]
    if s["uniformBytes"]:
      entries.append({"binding": s["buffers"], "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.uniform}})
    layout = dev.create_bind_group_layout(entries=entries)
    module = dev.create_shader_module(code=s["code"])
    pipe = dev.create_compute_pipeline(layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                                       compute={"module": module, "entry_point": s["entry"]})
    shaders.append((layout, pipe))
  vals = {v["name"]: (vars or {}).get(v["name"], v["value"]) for v in plan["vars"]}
  for i, data in zip(plan["inputs"], inputs):
    assert len(data) == plan["buffers"][i]["bytes"], f"input {plan['buffers'][i]['name']}: {len(data)} bytes"
    dev.queue.write_buffer(bufs[i], 0, data + b"\0" * (padded(len(data)) - len(data)))
  limit = dev.limits["max-compute-workgroups-per-dimension"]
  enc = dev.create_command_encoder()
  keep = []
  for st in plan["steps"]:
    if "copy" in st:
      c = st["copy"]
      enc.copy_buffer_to_buffer(bufs[c["src"]], 0, bufs[c["dest"]], 0, c["bytes"])
      continue
    s = plan["shaders"][st["shader"]]
    layout, pipe = shaders[st["shader"]]
    g = [sym_eval(e, vals) for e in st["global"]]
    dims = g
    if s["folded"]:
      total = math.prod(g)
      x = min(total, limit)
      dims = [x, math.ceil(total / x) if x else 0, 1]
    if 0 in dims: continue
    entries = [{"binding": i, "resource": {"buffer": bufs[b], "offset": 0, "size": bufs[b].size}} for i, b in enumerate(st["buffers"])]
    if s["uniformBytes"]:
      u = dev.create_buffer(size=s["uniformBytes"], usage=usage.UNIFORM | usage.COPY_DST)
      data = (struct.pack("<3I", *g) if s["folded"] else b"") + struct.pack(f"<{len(st['vars'])}i", *(vals[n] for n in st["vars"]))
      dev.queue.write_buffer(u, 0, data + b"\0" * (s["uniformBytes"] - len(data)))
      entries.append({"binding": s["buffers"], "resource": {"buffer": u, "offset": 0, "size": s["uniformBytes"]}})
      keep.append(u)
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipe)
    cpass.set_bind_group(0, dev.create_bind_group(layout=layout, entries=entries))
    cpass.dispatch_workgroups(*dims)
    cpass.end()
  dev.queue.submit([enc.finish()])
  return [bytes(dev.queue.read_buffer(bufs[o]))[:plan["buffers"][o]["bytes"]] for o in plan["outputs"]]
