"""The VIZ web server: the standard library's `http.server` serving the static page and a trace's JSON.

Endpoints (all GET, JSON unless noted):
  /                      the page (static/index.html; static/viz.js and static/viz.css beside it)
  /api/info              the run: command line, when, counts
  /api/kernels           the kernels in schedule (first compile) order: name, device, actions, estimates, launch totals
  /api/kernel/<i>        one kernel: stages, passes with each fired rule, its node table, linear program, source
  /api/timeline          every launch: device, start, duration, GFLOPS, GB/s
  /api/memory            the JIT's memory plans: each planned buffer's live range, arena and offset
  /api/trace             the whole trace file (to save it)
"""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STATIC = os.path.join(os.path.dirname(__file__), "static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".png": "image/png", ".json": "application/json"}


class TraceFileError(ValueError):
  """A file that is not a plugrad trace (or one of a newer format)."""


def load_trace(path: str) -> dict[str, Any]:
  from plugrad.trace import FORMAT
  try:
    with open(path) as f: data = json.load(f)
  except FileNotFoundError: raise TraceFileError(f"no trace file at {path!r}: record one with VIZ=1 (or VIZ=2) python script.py") from None
  except json.JSONDecodeError as e: raise TraceFileError(f"{path!r} is not a plugrad trace: not JSON ({e})") from None
  if not isinstance(data, dict) or not isinstance(data.get("kernels"), list) or "format" not in data:
    raise TraceFileError(f"{path!r} is not a plugrad trace: no 'format' and 'kernels'")
  if data["format"] > FORMAT: raise TraceFileError(f"{path!r} is trace format {data['format']}; this plugrad reads up to {FORMAT}: upgrade plugrad")
  return data


def kernel_list(data: dict[str, Any]) -> list[dict[str, Any]]:
  totals: dict[int, list[float]] = {}
  for ln in data["launches"]:
    if ln.get("kernel") is not None:
      t = totals.setdefault(ln["kernel"], [0, 0.0])
      t[0] += 1; t[1] += ln["us"]
  return [{"id": k["id"], "order": k["order"], "name": k["name"], "device": k["device"], "opts": k["opts"], "estimates": k["estimates"],
           "codegen_ms": k["codegen_ms"], "passes": len(k["passes"]), "steps": sum(len(p["steps"]) for p in k["passes"]),
           "launches": int(totals.get(k["id"], [0, 0])[0]), "us": totals.get(k["id"], [0, 0.0])[1]} for k in data["kernels"]]


def make_handler(data: dict[str, Any], path: str) -> type[BaseHTTPRequestHandler]:
  info = {"file": path, "argv": data.get("argv", []), "created": data.get("created"), "kernels": len(data["kernels"]),
          "launches": len(data["launches"]), "jits": len(data["memory"])}
  kernels = kernel_list(data)
  raw = json.dumps(data).encode()

  class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None: pass  # quiet: the page fetches a lot

    def _send(self, body: bytes, ctype: str, code: int = 200, extra: dict[str, str] | None = None) -> None:
      self.send_response(code)
      self.send_header("Content-Type", ctype)
      self.send_header("Content-Length", str(len(body)))
      self.send_header("Cache-Control", "no-store")
      for k, v in (extra or {}).items(): self.send_header(k, v)
      self.end_headers()
      self.wfile.write(body)

    def _json(self, obj: Any, code: int = 200) -> None: self._send(json.dumps(obj).encode(), "application/json", code)

    def do_GET(self) -> None:
      url = self.path.split("?", 1)[0]
      if url == "/": url = "/index.html"
      if url == "/api/info": return self._json(info)
      if url == "/api/kernels": return self._json(kernels)
      if url == "/api/timeline": return self._json(data["launches"])
      if url == "/api/memory": return self._json(data["memory"])
      if url == "/api/trace": return self._send(raw, "application/json", extra={"Content-Disposition": 'attachment; filename="plugrad-trace.json"'})
      if url.startswith("/api/kernel/"):
        i = url[len("/api/kernel/"):]
        if not i.isdigit() or int(i) >= len(data["kernels"]): return self._json({"error": f"no kernel {i!r}"}, 404)
        return self._json(data["kernels"][int(i)])
      name = url.lstrip("/")
      file = os.path.join(STATIC, name)
      if "/" in name or "\\" in name or name.startswith(".") or not os.path.isfile(file): return self._json({"error": f"not found: {url}"}, 404)
      with open(file, "rb") as f: self._send(f.read(), _TYPES.get(os.path.splitext(name)[1], "application/octet-stream"))

  return Handler


def make_server(path: str, port: int = 8128, host: str = "127.0.0.1") -> ThreadingHTTPServer:
  """A server (not yet serving) over trace file `path`; port 0 picks a free port (read it from `server.server_port`)."""
  data = load_trace(path)
  try: return ThreadingHTTPServer((host, port), make_handler(data, path))
  except OSError as e: raise OSError(f"VIZ cannot listen on {host}:{port} ({e.strerror}); pick another port with --port N (or VIZ_PORT=N)") from None


def serve(path: str, port: int = 8128, host: str = "127.0.0.1") -> None:
  """Serve trace file `path` until Ctrl-C."""
  server = make_server(path, port, host)
  print(f"VIZ: serving {path} at http://{host}:{server.server_port}/ (Ctrl-C to stop)", flush=True)
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()


def serve_in_thread(path: str, port: int = 0, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, threading.Thread]:
  """Serve in a daemon thread (tests, notebooks); stop with `server.shutdown()`."""
  server = make_server(path, port, host)
  th = threading.Thread(target=server.serve_forever, daemon=True)
  th.start()
  return server, th
