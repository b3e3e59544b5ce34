// plugrad VIZ: the page over a trace's JSON endpoints (plugrad/viz/server.py). Plain JS, no libraries, no network.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const MAX_NODES = 1500;  // bigger graphs are cut to the nodes nearest their root (a layered layout of more is unreadable)
const state = { kernels: [], kernel: null, view: "graph", item: null, step: 0, timeline: null, memory: null };

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of kids) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}
const fmtUs = us => us >= 1e6 ? (us / 1e6).toFixed(3) + " s" : us >= 1e3 ? (us / 1e3).toFixed(3) + " ms" : us.toFixed(2) + " us";
const fmtBytes = b => b >= 1 << 20 ? (b / (1 << 20)).toFixed(2) + " MiB" : b >= 1024 ? (b / 1024).toFixed(1) + " KiB" : b + " B";

// ---- graph layout: layers by longest path from the leaves (sources above their users), order by barycenters

function collect(nodes, root) {
  // the nodes under `root`, breadth first from it, at most MAX_NODES
  const seen = new Set([root]), queue = [root];
  for (let i = 0; i < queue.length && seen.size < MAX_NODES; i++) {
    for (const s of nodes[queue[i]][3]) if (!seen.has(s) && seen.size < MAX_NODES) { seen.add(s); queue.push(s); }
  }
  return { ids: [...seen].sort((a, b) => a - b), cut: seen.size >= MAX_NODES };
}

function layout(nodes, ids) {
  const inSet = new Set(ids), rank = new Map(), users = new Map();
  for (const i of ids) {  // the node table is in topological order (sources first), so one pass ranks it
    let r = 0;
    for (const s of nodes[i][3]) if (inSet.has(s)) { r = Math.max(r, rank.get(s) + 1); if (!users.has(s)) users.set(s, []); users.get(s).push(i); }
    rank.set(i, r);
  }
  const layers = [];
  for (const i of ids) { const r = rank.get(i); (layers[r] = layers[r] || []).push(i); }
  const pos = new Map();
  const setPos = () => layers.forEach(l => l.forEach((n, k) => pos.set(n, k)));
  setPos();
  const bary = (n, nbrs) => { const xs = nbrs.filter(x => pos.has(x)).map(x => pos.get(x)); return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : pos.get(n); };
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    const order = down ? layers.keys() : [...layers.keys()].reverse();
    for (const r of order) {
      if (!layers[r]) continue;
      const key = new Map(layers[r].map(n => [n, bary(n, down ? nodes[n][3].filter(s => inSet.has(s)) : (users.get(n) || []))]));
      layers[r].sort((a, b) => key.get(a) - key.get(b));
      layers[r].forEach((n, k) => pos.set(n, k));
    }
  }
  const box = new Map(), H = 34, VGAP = 46, HGAP = 14;
  let width = 0;
  const widths = layers.map(l => (l || []).reduce((w, n) => w + nodeWidth(nodes[n]) + HGAP, 0));
  const maxW = Math.max(...widths, 100);
  layers.forEach((l, r) => {
    let x = (maxW - widths[r]) / 2;
    for (const n of l || []) { const w = nodeWidth(nodes[n]); box.set(n, { x, y: r * (H + VGAP), w, h: H }); x += w + HGAP; }
    width = Math.max(width, x);
  });
  return { box, width: Math.max(width, maxW), height: layers.length * (H + VGAP) };
}

function nodeLabel(n) {
  const arg = n[2].length > 28 ? n[2].slice(0, 27) + "…" : n[2];
  return [n[0], (n[1] === "void" ? "" : n[1]) + (arg ? (n[1] === "void" ? "" : " ") + arg : "")];
}
function nodeWidth(n) { const [a, b] = nodeLabel(n); return Math.max(56, 6.2 * Math.max(a.length, b.length) + 12); }
function opColor(op) {
  const fixed = { SINK: "#e5e5e5", STORE: "#ffc9a8", LOAD: "#ffe2a0", INDEX: "#d8f0c8", CONST: "#eeeeee", VCONST: "#eeeeee", RANGE: "#c8dcff",
    END: "#c8dcff", ENDRANGE: "#c8dcff", REDUCE: "#f3b6c9", DEFINE_GLOBAL: "#ffd9f2", DEFINE_LOCAL: "#ffd9f2", DEFINE_REG: "#ffd9f2",
    DEFINE_VAR: "#e0d4ff", SPECIAL: "#c8f0f0", PROGRAM: "#ddd", WMMA: "#ffb0b0" };
  if (fixed[op]) return fixed[op];
  let h = 0;
  for (const c of op) h = (h * 31 + c.charCodeAt(0)) % 360;
  return `hsl(${h}, 60%, 88%)`;
}

function drawGraph(box, nodes, root, marks) {
  // render the graph under `root` into `box` (a .graphbox): marks maps node id -> css class (fired / new)
  const { ids, cut } = collect(nodes, root);
  const L = layout(nodes, ids);
  const s = svg("svg", { class: "graph", "data-nodes": ids.length, "data-root": root });
  const pad = 20;
  // small graphs keep a minimum view, so one node is not blown up to the whole box
  const vw = Math.max(L.width + 2 * pad, 420), vh = Math.max(L.height + 2 * pad, 260);
  let vb = { x: -pad - (vw - L.width - 2 * pad) / 2, y: -pad - (vh - L.height - 2 * pad) / 2, w: vw, h: vh };
  const setVB = () => s.setAttribute("viewBox", `${vb.x} ${vb.y} ${vb.w} ${vb.h}`);
  setVB();
  const g = svg("g");
  const inSet = new Set(ids);
  for (const i of ids) for (const src of nodes[i][3]) {
    if (!inSet.has(src)) continue;
    const a = L.box.get(src), b = L.box.get(i);
    const x1 = a.x + a.w / 2, y1 = a.y + a.h, x2 = b.x + b.w / 2, y2 = b.y, my = (y1 + y2) / 2;
    g.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}` }));
  }
  for (const i of ids) {
    const b = L.box.get(i), n = nodes[i], [l1, l2] = nodeLabel(n);
    const ng = svg("g", { class: "node" + (marks && marks.get(i) ? " " + marks.get(i) : ""), "data-id": i, transform: `translate(${b.x},${b.y})` });
    const title = svg("title");
    title.textContent = `#${i} ${n[0]} ${n[1]}\narg: ${n[2]}\nsrc: ${n[3].join(", ")}`;
    ng.append(title, svg("rect", { width: b.w, height: b.h, fill: opColor(n[0]) }));
    const t1 = svg("text", { x: 6, y: 14 }); t1.textContent = l1;
    const t2 = svg("text", { x: 6, y: 27 }); t2.textContent = l2;
    ng.append(t1, t2);
    g.append(ng);
  }
  s.append(g);
  panZoom(s, () => vb, v => { vb = v; setVB(); }, true);
  const label = box.querySelector(".label");
  if (label) label.textContent += ` — ${ids.length} nodes` + (cut ? ` (cut at ${MAX_NODES})` : "");
  box.append(s);
}

function panZoom(s, get, set, both) {
  // wheel zooms at the cursor, drag pans; `both`: zoom y too (graphs), else x only (timeline)
  s.addEventListener("wheel", ev => {
    ev.preventDefault();
    const vb = get(), r = s.getBoundingClientRect(), f = ev.deltaY > 0 ? 1.2 : 1 / 1.2;
    const px = vb.x + (ev.clientX - r.left) / r.width * vb.w, py = vb.y + (ev.clientY - r.top) / r.height * vb.h;
    set({ x: px - (px - vb.x) * f, y: both ? py - (py - vb.y) * f : vb.y, w: vb.w * f, h: both ? vb.h * f : vb.h });
  }, { passive: false });
  let drag = null;
  s.addEventListener("mousedown", ev => { drag = { x: ev.clientX, y: ev.clientY, vb: get() }; });
  window.addEventListener("mouseup", () => { drag = null; });
  s.addEventListener("mousemove", ev => {
    if (!drag) return;
    const r = s.getBoundingClientRect(), vb = drag.vb;
    set({ x: vb.x - (ev.clientX - drag.x) / r.width * vb.w, y: both ? vb.y - (ev.clientY - drag.y) / r.height * vb.h : vb.y, w: vb.w, h: vb.h });
  });
}

// ---- syntax highlighting of kernel source (C family, WGSL, Python): comments, strings, numbers, keywords, types

const KW = new Set("if else for while do return break continue switch case default struct const constexpr static inline extern volatile restrict __restrict__ __global__ __device__ __shared__ __kernel kernel device threadgroup thread using namespace typedef sizeof fn let var loop def import from in and or not lambda pass None True False unsigned signed void #define #include #pragma".split(" "));
const TY = /^(float|double|half|bfloat16|__half|__nv_bfloat16|int|uint|long|short|char|bool|size_t|u?int(8|16|32|64)_t|f16|f32|i32|u32|vec[234]<?|float[2-9]|half[2-9]|int[2-9]|uint[2-9]|array|ptr|atomic)/;
function highlight(src) {
  const re = /(\/\/[^\n]*|\/\*[\s\S]*?\*\/|#[^\n]*)|("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(\b(?:0x[0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?)[fuUlLh]*\b)|([A-Za-z_][A-Za-z_0-9]*)(\s*\()?/g;
  const esc = t => t.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  let out = "", last = 0, m;
  while ((m = re.exec(src)) !== null) {
    out += esc(src.slice(last, m.index));
    if (m[1]) out += `<span class="${m[1].startsWith("#") ? "tok-pp" : "tok-com"}">${esc(m[1])}</span>`;
    else if (m[2]) out += `<span class="tok-str">${esc(m[2])}</span>`;
    else if (m[3]) out += `<span class="tok-num">${esc(m[3])}</span>`;
    else {
      const w = m[4];
      const cls = KW.has(w) ? "tok-kw" : TY.test(w) ? "tok-ty" : m[5] ? "tok-fn" : null;
      out += (cls ? `<span class="${cls}">${esc(w)}</span>` : esc(w)) + (m[5] ? esc(m[5]) : "");
    }
    last = re.lastIndex;
  }
  return out + esc(src.slice(last));
}

// ---- kernels view

function renderKernelList() {
  const list = document.getElementById("kernel-list");
  list.replaceChildren();
  for (const k of state.kernels) {
    const item = el("div", { class: "kernel-item", "data-id": k.id, onclick: () => selectKernel(k.id) },
      el("span", { class: "order" }, k.order), el("span", { class: "name" }, k.name), el("span", {}, k.device),
      el("span", { class: "meta" }, `${k.launches} launches` + (k.launches ? `, ${fmtUs(k.us)}` : "") + `, ${k.passes} passes, ${k.steps} rewrites`));
    list.append(item);
  }
}

async function selectKernel(id) {
  for (const e of document.querySelectorAll(".kernel-item")) e.classList.toggle("selected", Number(e.dataset.id) === id);
  state.kernel = await getJSON(`/api/kernel/${id}`);
  state.item = { kind: "stage", index: 0 };
  state.step = 0;
  renderKernel();
}

function renderKernel() {
  const k = state.kernel, d = document.getElementById("kernel-detail");
  const est = k.estimates;
  const info = el("div", { class: "kinfo" }, el("h2", { id: "kernel-name" }, `${k.order}. ${k.name}`),
    el("div", {}, `${k.device} · ${k.renderer} · codegen ${k.codegen_ms} ms · global ${k.global_size.join("×")} local ${k.local_size.join("×")}`),
    el("div", {}, `estimates: ${est.flops} flops, ${est.bytes} bytes of buffers, ${est.traffic} bytes moved, ${est.local_bytes} local bytes`));
  const opts = el("div", { class: "opts" }, "actions: ");
  if (!k.opts.length) opts.append("none");
  for (const o of k.opts) opts.append(el("code", {}, o.replace(/^Opt\(op=OptOps\./, "").replace(/\)$/, "")));
  if (k.opts_given) opts.append(el("span", { class: "hint" }, " (given to get_program)"));
  info.append(opts);
  const tabs = el("div", { class: "subtabs" });
  for (const [v, label] of [["graph", "Graph & rewrites"], ["linear", "Linear program"], ["source", "Source"]]) {
    tabs.append(el("button", { class: state.view === v ? "active" : "", id: `sub-${v}`, onclick: () => { state.view = v; renderKernel(); } }, label));
  }
  const panel = el("div", { class: "panel", id: "kernel-panel" });
  d.replaceChildren(info, tabs, panel);
  if (state.view === "linear") panel.append(el("pre", { class: "code", id: "linear" }, k.linear.join("\n")));
  else if (state.view === "source") { const pre = el("pre", { class: "code", id: "source" }); pre.innerHTML = highlight(k.source); panel.append(pre); }
  else renderGraphPanel(panel);
}

function renderGraphPanel(panel) {
  const k = state.kernel;
  const side = el("div", { id: "graph-side" }, el("div", { class: "ghead" }, "stages"));
  k.stages.forEach((s, i) => side.append(el("div", { class: "gitem stage" + (state.item.kind === "stage" && state.item.index === i ? " selected" : ""),
    onclick: () => { state.item = { kind: "stage", index: i }; state.step = 0; renderKernel(); } }, s.name)));
  side.append(el("div", { class: "ghead" }, "rewrite passes"));
  if (!k.passes.length) side.append(el("div", { class: "gitem hint" }, "no rule fired"));
  k.passes.forEach((p, i) => side.append(el("div", { class: "gitem pass" + (state.item.kind === "pass" && state.item.index === i ? " selected" : ""),
    onclick: () => { state.item = { kind: "pass", index: i }; state.step = 0; renderKernel(); } },
    el("span", { class: "count" }, p.steps.length + (p.dropped ? "+" + p.dropped : "")), `${p.name}`, el("div", { class: "hint" }, `in ${p.phase}`))));
  const main = el("div", { id: "graph-main" });
  panel.append(side, main);
  if (state.item.kind === "stage") {
    const box = el("div", { class: "graphbox" }, el("div", { class: "label" }, `stage ${k.stages[state.item.index].name}`));
    main.append(el("div", { class: "graphs" }, box));
    drawGraph(box, k.nodes, k.stages[state.item.index].root, null);
    return;
  }
  // a pass: step 0 is its input, steps 1..n each fired rule (before | after), n+1 its output
  const p = k.passes[state.item.index], n = p.steps.length, i = state.step;
  const go = j => { state.step = Math.max(0, Math.min(n + 1, j)); renderKernel(); };
  main.append(el("div", { class: "stepper" }, el("button", { id: "step-first", onclick: () => go(0) }, "first"),
    el("button", { id: "step-prev", onclick: () => go(i - 1) }, "◀ prev"), el("span", { id: "step-label" },
      i === 0 ? `input of ${p.name}` : i === n + 1 ? `output of ${p.name}` : `rewrite ${i} of ${n}`),
    el("button", { id: "step-next", onclick: () => go(i + 1) }, "next ▶"), el("button", { id: "step-last", onclick: () => go(n + 1) }, "last"),
    el("span", { class: "hint" }, "(arrow keys step)")));
  const graphs = el("div", { class: "graphs" });
  if (i === 0 || i === n + 1) {
    const root = i === 0 ? p.input : p.output;
    main.append(el("div", { class: "rule", id: "rule" }, i === 0 ? `graph_rewrite ${p.name}: ${n} rule applications` + (p.dropped ? ` (+${p.dropped} not kept)` : "") : "result"));
    const box = el("div", { class: "graphbox" }, el("div", { class: "label" }, i === 0 ? "input" : "output"));
    graphs.append(box); main.append(graphs);
    drawGraph(box, k.nodes, root, null);
    return;
  }
  const st = p.steps[i - 1];
  main.append(el("div", { class: "rule", id: "rule" }, `${st.rule}\n  at ${st.location}`));
  const before = el("div", { class: "graphbox", id: "before" }, el("div", { class: "label" }, "before (the node the rule fired on, red)"));
  const after = el("div", { class: "graphbox", id: "after" }, el("div", { class: "label" }, "after (new nodes green)"));
  graphs.append(before, after); main.append(graphs);
  const old = new Set(collect(k.nodes, st.before).ids);
  drawGraph(before, k.nodes, st.before, new Map([[st.before, "fired"]]));
  const marks = new Map();
  for (const id of collect(k.nodes, st.after).ids) if (!old.has(id)) marks.set(id, "new");
  drawGraph(after, k.nodes, st.after, marks);
}

document.addEventListener("keydown", ev => {
  if (!state.kernel || state.view !== "graph" || !state.item || state.item.kind !== "pass") return;
  const n = state.kernel.passes[state.item.index].steps.length;
  if (ev.key === "ArrowRight") { state.step = Math.min(n + 1, state.step + 1); renderKernel(); }
  if (ev.key === "ArrowLeft") { state.step = Math.max(0, state.step - 1); renderKernel(); }
});

// ---- timeline: one lane per device (and kind), launches as bars at their start, width = duration

function renderTimeline() {
  const launches = state.timeline, host = document.getElementById("timeline");
  host.replaceChildren();
  if (!launches.length) { host.append(el("p", { class: "hint" }, "no launches were timed")); return; }
  const lanes = [...new Set(launches.map(l => `${l.device}${l.kind === "kernel" ? "" : " " + l.kind}`))];
  const t0 = Math.min(...launches.map(l => l.start_us)), t1 = Math.max(...launches.map(l => l.start_us + l.us));
  const span = Math.max(t1 - t0, 1), LANE = 36, LEFT = 110, W = 1200, H = lanes.length * LANE + 30;
  const total = launches.reduce((a, l) => a + l.us, 0);
  document.getElementById("tl-summary").textContent = `${launches.length} launches on ${lanes.length} lanes, ${fmtUs(total)} busy over ${fmtUs(span)}`;
  const s = svg("svg", { height: H, id: "timeline-svg" });
  const full = { x: 0, y: 0, w: span, h: H };
  let vb = { ...full };
  const plot = svg("g"), axis = svg("g", { class: "axis" }), labels = svg("g");
  lanes.forEach((name, i) => { const t = svg("text", { class: "lane-label", x: 6, y: 20 + i * LANE + LANE / 2 }); t.textContent = name; labels.append(t); });
  const bars = launches.map((l, idx) => {
    const lane = lanes.indexOf(`${l.device}${l.kind === "kernel" ? "" : " " + l.kind}`);
    const r = svg("rect", { class: "launch", "data-index": idx, "data-kernel": l.kernel === null ? "" : l.kernel, y: 22 + lane * LANE, height: LANE - 8,
      fill: l.kind === "copy" ? "#9bd49b" : l.kind === "graph" ? "#f0b860" : opColor(l.name).replace("88%", "70%") });
    const title = svg("title");
    title.textContent = `${l.name} on ${l.device}\n${fmtUs(l.us)} at +${fmtUs(l.start_us - t0)}` + (l.gflops !== null ? `\n${l.gflops} GFLOPS, ${l.gbs} GB/s` : "") +
      (l.global_size.length ? `\nglobal ${l.global_size.join("×")} local ${l.local_size.join("×")}` : "");
    r.append(title);
    r.addEventListener("click", () => {
      document.getElementById("tl-detail").textContent = title.textContent.replace(/\n/g, " · ");
      if (l.kernel !== null) { showView("kernels"); selectKernel(l.kernel); }
    });
    plot.append(r);
    return [r, l];
  });
  const draw = () => {
    const pxPerUs = (W - LEFT) / vb.w;
    for (const [r, l] of bars) {
      r.setAttribute("x", LEFT + (l.start_us - t0 - vb.x) * pxPerUs);
      r.setAttribute("width", Math.max(1, l.us * pxPerUs));
    }
    axis.replaceChildren();
    const step = Math.pow(10, Math.floor(Math.log10(vb.w / 5)));
    for (let t = Math.ceil(vb.x / step) * step; t <= vb.x + vb.w; t += step) {
      const x = LEFT + (t - vb.x) * pxPerUs;
      axis.append(svg("line", { x1: x, x2: x, y1: 14, y2: H }));
      const tx = svg("text", { x: x + 2, y: 11 }); tx.textContent = fmtUs(t); axis.append(tx);
    }
  };
  s.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const clip = svg("clipPath", { id: "tl-clip" }); clip.append(svg("rect", { x: LEFT, y: 0, width: W - LEFT, height: H }));
  const defs = svg("defs"); defs.append(clip);
  const clipped = svg("g", { "clip-path": "url(#tl-clip)" }); clipped.append(axis, plot);
  s.append(defs, clipped, labels);
  host.append(s);
  const set = v => { vb = { x: Math.max(-span * 0.05, v.x), y: 0, w: Math.min(Math.max(v.w, 0.01), span * 1.1), h: H }; draw(); };
  // zoom and pan act on the time range: map the cursor through the plot area, not the svg's own viewBox
  s.addEventListener("wheel", ev => {
    ev.preventDefault();
    const r = s.getBoundingClientRect(), f = ev.deltaY > 0 ? 1.25 : 1 / 1.25;
    const px = vb.x + Math.max(0, (ev.clientX - r.left) / r.width * W - LEFT) / (W - LEFT) * vb.w;
    set({ x: px - (px - vb.x) * f, w: vb.w * f });
  }, { passive: false });
  let drag = null;
  s.addEventListener("mousedown", ev => { drag = { x: ev.clientX, vb: { ...vb } }; });
  window.addEventListener("mouseup", () => { drag = null; });
  s.addEventListener("mousemove", ev => {
    if (!drag) return;
    const r = s.getBoundingClientRect();
    set({ x: drag.vb.x - (ev.clientX - drag.x) / r.width * W / (W - LEFT) * drag.vb.w, w: drag.vb.w });
  });
  document.getElementById("tl-zoom-in").onclick = () => set({ x: vb.x + vb.w * 0.25, w: vb.w / 2 });
  document.getElementById("tl-zoom-out").onclick = () => set({ x: vb.x - vb.w * 0.5, w: vb.w * 2 });
  document.getElementById("tl-reset").onclick = () => set({ ...full });
  draw();
}

// ---- memory: per TinyJit capture, each planned buffer as a box: launches it is live over × its bytes in the arena

function renderMemory() {
  const host = document.getElementById("memory");
  host.replaceChildren();
  if (!state.memory.length) { host.append(el("p", { class: "hint", style: "padding:8px" }, "no TinyJit capture planned memory in this run")); return; }
  for (const m of state.memory) {
    const saved = m.bytes_before ? (100 * (1 - m.bytes_after / m.bytes_before)).toFixed(0) : 0;
    const div = el("div", { class: "memplan" }, el("h3", {}, `TinyJit(${m.jit})`),
      el("div", {}, `${m.buffers.length} intermediate buffers in ${m.launches.length} launches: ${fmtBytes(m.bytes_before)} → ${fmtBytes(m.bytes_after)} (${saved}% saved)`));
    const arenas = [...new Set(m.buffers.map(b => b.arena))];
    for (const a of arenas) {
      const bufs = m.buffers.filter(b => b.arena === a), size = Math.max(...bufs.map(b => b.arena_bytes), 1);
      const W = 1100, H = 220, LEFT = 70, n = Math.max(m.launches.length, 1), xs = (W - LEFT) / n;
      const s = svg("svg", { class: "memsvg", viewBox: `0 0 ${W} ${H + 20}`, width: "100%" });
      const lab = svg("text", { x: 2, y: 12, class: "lane-label" }); lab.textContent = `${bufs[0].device} #${a}`;
      const lab2 = svg("text", { x: 2, y: 28, class: "lane-label" }); lab2.textContent = fmtBytes(size);
      s.append(lab, lab2, svg("rect", { x: LEFT, y: 0, width: W - LEFT, height: H, fill: "#f4f5f8", stroke: "#ccd" }));
      for (const b of bufs) {
        const r = svg("rect", { class: "membuf", x: LEFT + b.first * xs, width: Math.max(2, (b.last - b.first + 1) * xs), y: b.offset / size * H,
          height: Math.max(1, b.nbytes / size * H), fill: opColor(b.dtype + b.offset).replace("88%", "65%") });
        const t = svg("title");
        t.textContent = `${b.dtype}, ${fmtBytes(b.nbytes)} at byte ${b.offset}\nlive in launches ${b.first}..${b.last}: ${m.launches[b.first]} .. ${m.launches[b.last]}`;
        r.append(t); s.append(r);
      }
      const ax = svg("text", { x: LEFT, y: H + 14, class: "lane-label" }); ax.textContent = `launch 0 … ${n - 1} →   (y: byte offset in the arena)`;
      s.append(ax);
      div.append(s);
    }
    host.append(div);
  }
}

// ---- views

function showView(v) {
  for (const b of document.querySelectorAll("nav .tab")) b.classList.toggle("active", b.dataset.view === v);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("hidden", s.id !== `view-${v}`);
  if (v === "timeline" && state.timeline) renderTimeline();
  if (v === "memory" && state.memory) renderMemory();
}

async function main() {
  for (const b of document.querySelectorAll("nav .tab")) b.addEventListener("click", () => showView(b.dataset.view));
  const [info, kernels, timeline, memory] = await Promise.all([getJSON("/api/info"), getJSON("/api/kernels"), getJSON("/api/timeline"), getJSON("/api/memory")]);
  state.kernels = kernels; state.timeline = timeline; state.memory = memory;
  document.getElementById("run-info").textContent = `${info.argv.join(" ")} — ${info.kernels} kernels, ${info.launches} launches, ${info.file}`;
  renderKernelList();
  document.body.dataset.ready = "1";
}

main().catch(e => { document.getElementById("kernel-detail").replaceChildren(el("p", {}, "failed to load the trace: " + e.message)); throw e; });
