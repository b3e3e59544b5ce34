"""Runs an exported WebGPU model in headless Chromium (apt `chromium`, driven by playwright) on its software adapter.

`run_in_chromium(out_dir, inputs)` serves `out_dir` over http on 127.0.0.1 (a secure context: WebGPU needs one), opens
index.html, imports model.js in the page and runs it. Raises `BrowserUnavailable` with the reason when there is no
Chromium, no playwright, or no WebGPU adapter in the browser."""
from __future__ import annotations

import base64
import functools
import http.server
import shutil
import threading
from pathlib import Path
from typing import Any

FLAGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-vulkan=swiftshader", "--use-webgpu-adapter=swiftshader", "--no-sandbox"]


class BrowserUnavailable(RuntimeError):
  """No browser with a WebGPU adapter here (the message says what is missing)."""


def chromium_path() -> str | None:
  return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class _Quiet(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args: Any) -> None: pass


_RUN = """async ([inputs, vars]) => {
  const m = await import("/model.js");
  const model = await m.load();
  const decode = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const outs = await model.run(inputs.map(decode), vars);
  const info = model.device.adapterInfo ?? {};
  const b64 = (a) => {
    const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    let s = "";
    for (const x of u) s += String.fromCharCode(x);
    return btoa(s);
  };
  return {outputs: outs.map(b64), adapter: `${info.vendor ?? "?"} ${info.architecture ?? ""} ${info.description ?? ""}`.trim()};
}"""


def run_in_chromium(out_dir: Path, inputs: list[bytes], vars: dict[str, int] | None = None) -> tuple[list[bytes], str]:
  """(the outputs' bytes, the adapter the browser used)."""
  exe = chromium_path()
  if exe is None: raise BrowserUnavailable("no chromium on PATH (apt-get install chromium)")
  try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
  except ImportError: raise BrowserUnavailable("playwright is not installed (pip install playwright)") from None
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out_dir)))
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
      try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        has = page.evaluate("async () => !!navigator.gpu && !!(await navigator.gpu.requestAdapter())")
        if not has: raise BrowserUnavailable(f"Chromium ({exe}) offers no WebGPU adapter with {' '.join(FLAGS)}")
        try: res = page.evaluate(_RUN, [[base64.b64encode(x).decode() for x in inputs], vars or {}])
        except PlaywrightError as e: raise AssertionError(f"model.js failed in Chromium: {e}") from None
      finally: browser.close()
  finally:
    server.shutdown()
    server.server_close()
  return [base64.b64decode(o) for o in res["outputs"]], res["adapter"]
