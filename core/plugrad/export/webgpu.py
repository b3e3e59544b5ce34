"""The WebGPU target: model.js (an ES module holding the plan and the WGSL), index.html (a demo page) and the weights as
safetensors. The kernels are the WGSL the WEBGPU device ran in the capture.

The plan (`PLAN` in model.js, `plan()` here) is plain data: buffers, shaders, steps. A shader follows plugrad-webgpu's
kernel ABI (docs/writing-a-backend.md): storage buffer i at @binding(i), then, when the kernel needs it, a uniform at
@binding(number of buffers) holding the folded launch size (three u32, when the WGSL holds plugrad-webgpu's fold mark)
and the variables (one i32 each, in name order). A folded kernel is dispatched as its total workgroup count spread over
x and y; every other kernel with its global size.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from plugrad.export.common import Captured, Copy, ExportError, safetensors_bytes, sym_data
from plugrad.plugin.hookspecs import parse_device

# the comment plugrad-webgpu's renderer writes into a kernel rendered for a folded launch (plugrad_webgpu.renderer.FOLD_MARK)
FOLD_MARK = "plugrad-webgpu: folded launch"
_ENTRY = re.compile(r"@compute\s+@workgroup_size\((\d+),\s*(\d+),\s*(\d+)\)\s*fn\s+(\w+)\s*\(")
_LIMIT_DEFAULTS = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256, "maxComputeWorkgroupSizeY": 256,
                   "maxComputeWorkgroupSizeZ": 64, "maxComputeWorkgroupStorageSize": 16384, "maxStorageBuffersPerShaderStage": 8,
                   "maxStorageBufferBindingSize": 134217728, "maxBufferSize": 268435456}


def padded(nbytes: int) -> int: return max(4, (nbytes + 3) & ~3)


def plan(cap: Captured) -> dict[str, Any]:
  """The plan model.js runs (JSON-able)."""
  if parse_device(cap.device)[0] != "WEBGPU":
    raise ExportError(f"export_model(target='webgpu') needs the model on the WEBGPU device (its kernels are WGSL); it was captured on {cap.device}")
  shaders: list[dict[str, Any]] = []
  by_src: dict[str, int] = {}
  steps: list[dict[str, Any]] = []
  need = dict.fromkeys(_LIMIT_DEFAULTS, 0)
  features: set[str] = set()
  for st in cap.steps:
    if isinstance(st, Copy):
      if st.dest.offset or st.src.offset: raise ExportError("export_model(target='webgpu'): a copy between views of buffers cannot be exported")
      steps.append({"copy": {"dest": st.dest.storage, "src": st.src.storage, "bytes": padded(st.dest.size * st.dest.dtype.itemsize)}})
      continue
    p = st.program
    src = p.source
    if any(a.offset for a in st.args):
      raise ExportError(f"export_model(target='webgpu'): kernel {p.name!r} takes a view of a buffer; WebGPU binds whole buffers")
    if (i := by_src.get(src)) is None:
      if (m := _ENTRY.search(src)) is None: raise ExportError(f"export_model: the WGSL of kernel {p.name!r} has no @compute entry point")
      wg = [int(m.group(k)) for k in (1, 2, 3)]
      folded = FOLD_MARK in src
      words = (3 if folded else 0) + len(p.vars)
      i = by_src[src] = len(shaders)
      shaders.append({"name": p.name, "entry": m.group(4), "code": src, "buffers": len(st.args), "workgroup": wg, "folded": folded,
                      "uniformBytes": 0 if words == 0 else (4 * words + 15) // 16 * 16})
      if re.search(r"^\s*enable\s+f16\s*;", src, re.M): features.add("shader-f16")
      for k, v in (("maxComputeInvocationsPerWorkgroup", wg[0] * wg[1] * wg[2]), ("maxComputeWorkgroupSizeX", wg[0]),
                   ("maxComputeWorkgroupSizeY", wg[1]), ("maxComputeWorkgroupSizeZ", wg[2]),
                   ("maxComputeWorkgroupStorageSize", p.estimates.local_bytes), ("maxStorageBuffersPerShaderStage", len(st.args))):
        need[k] = max(need[k], v)
    steps.append({"shader": i, "kernel": p.name, "buffers": [a.storage for a in st.args], "vars": list(st.vars),
                  "global": [sym_data(g) for g in p.global_size]})
  biggest = max((padded(s.nbytes) for s in cap.storages), default=4)
  need["maxStorageBufferBindingSize"] = need["maxBufferSize"] = biggest
  return {
    "format": "plugrad-export-webgpu/1", "name": cap.name, "weights": "model.safetensors",
    "buffers": [{"name": s.name, "kind": s.kind, "bytes": s.nbytes, "dtype": s.dtype.name, "shape": list(s.shape)} for s in cap.storages],
    "inputs": [s.index for s in cap.inputs], "outputs": [s.index for s in cap.outputs],
    "vars": [{"name": v.name, "min": v.lo, "max": v.hi, "value": v.value} for v in cap.vars],
    "shaders": shaders, "steps": steps, "features": sorted(features),
    "limits": {k: v for k, v in need.items() if v > _LIMIT_DEFAULTS[k]},  # what the kernels need beyond WebGPU's defaults
  }


MODEL_JS = """\
// model.js: %NAME% exported by plugrad.export for WebGPU (see docs/export.md). An ES module:
//   import { load } from "./model.js";
//   const model = await load();                      // fetches model.safetensors next to this file
//   const [out] = await model.run([new Float32Array(...)], {n: 5});   // inputs in order; variables by name
export const PLAN = %PLAN%;

const TYPED = {bool: Uint8Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array, uint16: Uint16Array, float16: Uint16Array,
  bfloat16: Uint16Array, int32: Int32Array, uint32: Uint32Array, float32: Float32Array, int64: BigInt64Array, uint64: BigUint64Array,
  float64: Float64Array};
const padded = (n) => Math.max(4, (n + 3) & ~3);

// a launch size: an int, or [op, ...args] over the variables (div truncates)
function size(e, vals) {
  if (typeof e === "number") return e;
  const [op, ...a] = e;
  if (op === "var") return vals[a[0]];
  const v = a.map((x) => size(x, vals));
  switch (op) {
    case "add": return v[0] + v[1];
    case "sub": return v[0] - v[1];
    case "mul": return v[0] * v[1];
    case "div": return Math.trunc(v[0] / v[1]);
    case "mod": return v[0] - Math.trunc(v[0] / v[1]) * v[1];
    case "max": return Math.max(...v);
    case "lt": return v[0] < v[1] ? 1 : 0;
    case "neg": return -v[0];
    case "where": return v[0] ? v[1] : v[2];
  }
  throw new Error(`model.js: unknown size op ${op}`);
}

async function readSafetensors(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`model.js: fetching the weights ${url} failed: ${res.status} ${res.statusText}`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const tensors = new Map();
  for (const [name, t] of Object.entries(header)) {
    if (name !== "__metadata__") tensors.set(name, {dtype: t.dtype, bytes: bytes.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1])});
  }
  return tensors;
}

function withPadding(data, nbytes) {
  const src = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (src.byteLength === padded(nbytes) && src.byteOffset % 4 === 0) return src;
  const out = new Uint8Array(padded(nbytes));
  out.set(src.subarray(0, nbytes));
  return out;
}

// Create the buffers and pipelines and upload the weights. options: weightsUrl, device (a GPUDevice to use)
export async function load(options = {}) {
  let dev = options.device;
  if (!dev) {
    if (!globalThis.navigator?.gpu) throw new Error("model.js: WebGPU is not available (navigator.gpu is missing)");
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) throw new Error("model.js: no WebGPU adapter");
    for (const [k, v] of Object.entries(PLAN.limits)) {
      if (adapter.limits[k] < v) throw new Error(`model.js: the kernels need ${k} = ${v}, the adapter offers ${adapter.limits[k]}`);
    }
    for (const f of PLAN.features) if (!adapter.features.has(f)) throw new Error(`model.js: the kernels need the WebGPU feature ${f}`);
    dev = await adapter.requestDevice({requiredLimits: PLAN.limits, requiredFeatures: PLAN.features});
  }
  const U = GPUBufferUsage;
  const weights = await readSafetensors(options.weightsUrl ?? new URL(PLAN.weights, import.meta.url));
  const buffers = PLAN.buffers.map((b) => dev.createBuffer({label: b.name, size: padded(b.bytes), usage: U.STORAGE | U.COPY_SRC | U.COPY_DST}));
  PLAN.buffers.forEach((b, i) => {
    if (b.kind !== "weight") return;
    const w = weights.get(b.name);
    if (!w || w.bytes.byteLength !== b.bytes) throw new Error(`model.js: the weights file has no tensor ${b.name} of ${b.bytes} bytes`);
    dev.queue.writeBuffer(buffers[i], 0, withPadding(w.bytes, b.bytes));
  });
  dev.pushErrorScope("validation");  // a kernel this browser's WGSL compiler rejects fails here, with its message
  const shaders = PLAN.shaders.map((s) => {
    const entries = [];
    for (let i = 0; i < s.buffers; i++) entries.push({binding: i, visibility: GPUShaderStage.COMPUTE, buffer: {type: "storage"}});
    if (s.uniformBytes) entries.push({binding: s.buffers, visibility: GPUShaderStage.COMPUTE, buffer: {type: "uniform"}});
    const layout = dev.createBindGroupLayout({entries});
    const module = dev.createShaderModule({label: s.name, code: s.code});
    const pipeline = dev.createComputePipeline({label: s.name, layout: dev.createPipelineLayout({bindGroupLayouts: [layout]}),
      compute: {module, entryPoint: s.entry}});
    return {...s, layout, pipeline};
  });
  const steps = PLAN.steps.map((st) => {
    if (st.copy) return st;
    const s = shaders[st.shader];
    const uniform = s.uniformBytes ? dev.createBuffer({size: s.uniformBytes, usage: U.UNIFORM | U.COPY_DST}) : null;
    const entries = st.buffers.map((b, i) => ({binding: i, resource: {buffer: buffers[b]}}));
    if (uniform) entries.push({binding: s.buffers, resource: {buffer: uniform}});
    return {...st, s, uniform, group: dev.createBindGroup({label: s.name, layout: s.layout, entries})};
  });
  const rejected = await dev.popErrorScope();
  if (rejected) throw new Error(`model.js: WebGPU rejected the model: ${rejected.message}`);
  const readback = PLAN.outputs.map((o) => dev.createBuffer({size: padded(PLAN.buffers[o].bytes), usage: U.MAP_READ | U.COPY_DST}));
  const limit = dev.limits.maxComputeWorkgroupsPerDimension;

  // Run once: inputs are typed arrays (or ArrayBuffers) of each input's bytes; vars maps variable names to values
  async function run(inputs, vars = {}) {
    if (inputs.length !== PLAN.inputs.length) throw new Error(`model.js: the model takes ${PLAN.inputs.length} inputs, got ${inputs.length}`);
    const vals = {};
    for (const v of PLAN.vars) {
      vals[v.name] = vars[v.name] ?? v.value;
      if (!(vals[v.name] >= v.min && vals[v.name] <= v.max)) throw new Error(`model.js: ${v.name} = ${vals[v.name]} is outside [${v.min}, ${v.max}]`);
    }
    inputs.forEach((x, i) => {
      const b = PLAN.buffers[PLAN.inputs[i]];
      const data = ArrayBuffer.isView(x) ? x : new Uint8Array(x);
      if (data.byteLength !== b.bytes) throw new Error(`model.js: input ${i} (${b.name}) needs ${b.bytes} bytes, got ${data.byteLength}`);
      dev.queue.writeBuffer(buffers[PLAN.inputs[i]], 0, withPadding(data, b.bytes));
    });
    dev.pushErrorScope("validation");
    const enc = dev.createCommandEncoder();
    for (const st of steps) {
      if (st.copy) { enc.copyBufferToBuffer(buffers[st.copy.src], 0, buffers[st.copy.dest], 0, st.copy.bytes); continue; }
      const g = st.global.map((e) => size(e, vals));
      let dims = g;
      if (st.s.folded) {
        const total = g[0] * g[1] * g[2];
        const x = Math.min(total, limit);
        dims = [x, x ? Math.ceil(total / x) : 0, 1];
      }
      if (dims.includes(0)) continue;
      if (st.uniform) {
        const words = new DataView(new ArrayBuffer(st.s.uniformBytes));
        let at = 0;
        if (st.s.folded) for (const d of g) { words.setUint32(at, d, true); at += 4; }
        for (const n of st.vars) { words.setInt32(at, vals[n], true); at += 4; }
        dev.queue.writeBuffer(st.uniform, 0, words.buffer);
      }
      const pass = enc.beginComputePass();
      pass.setPipeline(st.s.pipeline);
      pass.setBindGroup(0, st.group);
      pass.dispatchWorkgroups(dims[0], dims[1], dims[2]);
      pass.end();
    }
    PLAN.outputs.forEach((o, i) => enc.copyBufferToBuffer(buffers[o], 0, readback[i], 0, padded(PLAN.buffers[o].bytes)));
    dev.queue.submit([enc.finish()]);
    const failed = await dev.popErrorScope();
    if (failed) throw new Error(`model.js: WebGPU rejected the run: ${failed.message}`);
    await Promise.all(readback.map((b) => b.mapAsync(GPUMapMode.READ)));
    return PLAN.outputs.map((o, i) => {
      const b = PLAN.buffers[o];
      const bytes = new Uint8Array(readback[i].getMappedRange()).slice(0, b.bytes);
      readback[i].unmap();
      const T = TYPED[b.dtype] ?? Uint8Array;
      return new T(bytes.buffer, 0, b.bytes / T.BYTES_PER_ELEMENT);
    });
  }
  return {run, device: dev, plan: PLAN};
}
"""

INDEX_HTML = """\
<!doctype html>
<meta charset="utf-8">
<title>%NAME% (plugrad export, WebGPU)</title>
<style>body { font: 14px monospace; margin: 2em; } pre { white-space: pre-wrap; }</style>
<h3>%NAME%: exported by plugrad for WebGPU</h3>
<p>Serve this folder over http (for example <code>python -m http.server</code>) and open it in a browser with WebGPU.</p>
<button id="run">run on random inputs</button>
<pre id="log">loading...</pre>
<script type="module">
import { load, PLAN } from "./model.js";
const log = (s) => { document.getElementById("log").textContent += s + "\\n"; };
document.getElementById("log").textContent = "";
try {
  const model = await load();
  log(`loaded: ${PLAN.steps.length} steps, ${PLAN.shaders.length} shaders, ${PLAN.buffers.length} buffers`);
  const random = (b) => {
    const T = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array}[b.dtype] ?? Uint8Array;
    const a = new T(b.bytes / T.BYTES_PER_ELEMENT);
    for (let i = 0; i < a.length; i++) a[i] = T === Float32Array ? Math.random() : Math.floor(Math.random() * 2);
    return a;
  };
  const go = async () => {
    const inputs = PLAN.inputs.map((i) => random(PLAN.buffers[i]));
    const t0 = performance.now();
    const outs = await model.run(inputs);
    const ms = (performance.now() - t0).toFixed(2);
    const show = (o) => Array.from(o.slice(0, 10)).map((x) => Number(x).toFixed(4)).join(" ");
    outs.forEach((o, i) => log(`output ${i} (${PLAN.buffers[PLAN.outputs[i]].shape}): ${show(o)}` +
      `${o.length > 10 ? " ..." : ""}  (${ms} ms)`));
  };
  document.getElementById("run").onclick = go;
  await go();
} catch (e) { log("error: " + e.message); }
</script>
"""


def generate(cap: Captured) -> dict[str, str | bytes]:
  p = plan(cap)
  return {"model.js": MODEL_JS.replace("%NAME%", cap.name).replace("%PLAN%", json.dumps(p)),
          "index.html": INDEX_HTML.replace("%NAME%", cap.name),
          "model.safetensors": safetensors_bytes(cap.weights, {"format": "plugrad-export", "model": cap.name})}


def write(cap: Captured, out_dir: Path) -> list[Path]:
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for name, content in generate(cap).items():
    path = out_dir / name
    if isinstance(content, bytes): path.write_bytes(content)
    else: path.write_text(content)
    paths.append(path)
  return paths


def read_plan(model_js: str) -> dict[str, Any]:
  """The plan inside a generated model.js (for tools and tests that run it outside a browser)."""
  m = re.search(r"^export const PLAN = (.*);$", model_js, re.M)
  if m is None: raise ExportError("read_plan: this model.js holds no `export const PLAN = ...;` line")
  return json.loads(m.group(1))
