"""`python -m plugrad`: what is installed and does it work.

  python -m plugrad plugins [--json]          every backend plugin: distribution, version, API, status, devices
  python -m plugrad devices [--json] [NAME..] every device (or the named ones): PASS/FAIL of the smoke kernel, UNAVAILABLE
                                              where the device is absent here (no driver or hardware: the probe's reason)
  python -m plugrad viz [--port N] [TRACE]     serve a VIZ trace as a local web page (docs/viz.md)
  python -m plugrad replay record|check ...    process replay: record get_program inputs, regenerate and diff (docs/replay.md)
  python -m plugrad export SCRIPT:FUNC --target c|webgpu --out DIR   a model as standalone C or WebGPU (docs/export.md)
  python -m plugrad onnx MODEL.onnx [--input NAME=FILE.npy] [--dim NAME=N] [--jit]   run an ONNX model: outputs, timings (docs/onnx.md)
  python -m plugrad conformance DEVICE [--tiers render,compile,emulate,run] [--report FILE.md] [--json FILE.json] [-- PYTEST_ARGS..]
                                              the conformance suite on one device (a child pytest, SPEC=1): a Markdown report
                                              on stdout (pytest's output on stderr), per tier, with skip reasons, declared and
                                              actual failures; a device unavailable here gets every tier but run, and its run
                                              tier is reported skipped with the probe's reason (a failure if --tiers names run)
  python -m plugrad new-backend NAME [--out DIR]   a plugin skeleton DIR/plugrad-<name>/ for device NAME (upper-cased)

A plugin's status is `active`, `unavailable here: <the probe's reason>` (loaded, but none of its devices can be used on this
machine: no driver, no hardware), `conflict: <name> is also claimed by ...` (its other devices work), `failed: <why>` or
`blocked (<why>)`.

Exit status: 0 when nothing failed; 1 when a plugin failed or conflicts under PLUGRAD_STRICT_PLUGINS=1 (`plugins`), a device that
is usable here fails its smoke test or a named device fails or is unavailable (`devices`), or a conformance test fails or a declared failure passes
(`conformance`); 2 for bad arguments (an unknown device name or tier, a name that cannot be a device, a skeleton directory that
exists, pytest missing for `conformance`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from plugrad.device.registry import Device
from plugrad.device.smoke import SmokeResult, run_smoke
from plugrad.errors import DeviceError, InvalidDeviceStringError, UnknownDeviceError
from plugrad.helpers import SettingsError
from plugrad.plugin.hookspecs import API_VERSION, parse_device
from plugrad.plugin.manager import PluginRecord, PluginWarning, core_version


def _table(rows: list[list[str]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def cmd_plugins(as_json: bool) -> int:
  mgr = Device.manager
  records = mgr.records()
  failed = [r for r in records if r.status == "failed"]
  conflicts = sorted(mgr.conflicts())
  if as_json:
    print(json.dumps({"plugrad": core_version(), "api": f"{API_VERSION[0]}.{API_VERSION[1]}", "strict": mgr.strict,
                      "plugins": [{**r.as_dict(), "unavailable": _unavailable(r)} for r in records]}, indent=2))
  else:
    rows = [["NAME", "DISTRIBUTION", "VERSION", "API", "DEVICES", "STATUS"]]
    for r in records:
      status = f"blocked ({r.reason})" if r.status == "blocked" else r.status_text
      if r.status == "active" and (absent := _unavailable(r)):
        reasons = list(dict.fromkeys(absent.values()))
        status = (f"unavailable here: {'; '.join(reasons)}" if len(absent) == len(r.specs) else
                  "active; " + "; ".join(f"{d} unavailable here: {why}" for d, why in absent.items()))
      rows.append([r.name, r.distribution, r.version, r.api, ", ".join(r.devices) or "-", status])
    print(f"plugrad {core_version()}, plugin API {API_VERSION[0]}.{API_VERSION[1]}")
    print(_table(rows))
    if failed: print(f"\n{len(failed)} plugin(s) failed; the devices they provide raise the recorded error when used.")
    if conflicts:
      print(f"\n{len(conflicts)} device name(s) claimed by more than one plugin ({', '.join(conflicts)}): using one raises PluginConflictError; "
            "choose a plugin with PLUGRAD_PLUGINS or uninstall one.")
  return 1 if (failed or conflicts) and mgr.strict else 0


def _unavailable(rec: PluginRecord) -> dict[str, str]:
  """{device: the probe's reason} for the devices of an active plugin that cannot be used here (a probe that raises is
  a failure, shown by `devices`, not an absence)."""
  if rec.status != "active": return {}
  out = {}
  for s in rec.specs:
    try: reason = Device.manager.probe(s.name)
    except (DeviceError, SettingsError): continue
    if reason is not None: out[s.name] = reason
  return out


def _device_row(name: str) -> tuple[dict[str, Any], bool]:
  """The report for one declared device and whether it counts as usable here (so that its failure is an error)."""
  mgr, base = Device.manager, parse_device(name)[0]
  row: dict[str, Any] = {"device": name}
  try: entry = mgr.entry(base)
  except DeviceError as e:  # a conflict or a plugin refused after declaring it
    row.update(SmokeResult(name, False, f"{type(e).__name__}: {str(e).splitlines()[0]}", stage="device", error=f"{type(e).__name__}: {e}").as_dict(),
               available=False, probe=None)
    return row, True
  row.update(distribution=entry.plugin.distribution, version=entry.plugin.version, plugin=entry.plugin.name, priority=entry.spec.priority,
             aliases=list(entry.spec.aliases), description=entry.spec.description)
  try: reason = mgr.probe(base)
  except (DeviceError, SettingsError) as e:  # a probe that raised (a plugin bug) or a misconfigured device: a failure
    row.update(SmokeResult(name, False, f"{type(e).__name__}: {e}", stage="device", error=f"{type(e).__name__}: {e}").as_dict(),
               available=False, probe=None)
    return row, True
  row.update(available=reason is None, probe=reason)
  if reason is not None:
    row.update(SmokeResult(name, False, f"unavailable here: {reason}", stage="device", absent=True).as_dict())
    return row, False
  row.update(run_smoke(name).as_dict())
  return row, True


def cmd_devices(as_json: bool, names: Sequence[str]) -> int:
  mgr = Device.manager
  wanted = [] if names else mgr.known()
  for n in names:
    try: wanted.append(Device.canonicalize(n))
    except (UnknownDeviceError, InvalidDeviceStringError) as e:
      print(f"plugrad: {e}", file=sys.stderr)
      return 2
    except DeviceError: wanted.append(n.upper())  # declared but unusable (conflict, refused plugin): reported in its row
  default, default_error, fallback = None, None, []
  try: default = Device.DEFAULT
  except DeviceError as e: default_error = f"{type(e).__name__}: {e}"
  dev_env = mgr.env.get("DEV", "").strip()
  if default is not None and not dev_env: fallback = [c.text for c in mgr.fallback_causes(Device.spec(default))]
  rows, failed = [], False
  for name in wanted:
    row, counts = _device_row(name)
    row["default"] = name == default
    rows.append(row)
    failed |= (row["smoke"] == "FAIL" and counts) or (row["smoke"] != "PASS" and bool(names))
  rows.sort(key=lambda r: (-r.get("priority", -(10**9)), r["device"]))
  if as_json:
    print(json.dumps({"default": default, "default_error": default_error, "default_fallback": fallback, "devices": rows}, indent=2))
    return 1 if failed else 0
  table = [["DEVICE", "PRIORITY", "PLUGIN", "SMOKE", "DETAIL"]]
  for r in rows:
    plugin = f"{r['distribution']} {r['version']} ({r['plugin']})" if "distribution" in r else "-"
    table.append([r["device"] + ("*" if r["default"] else ""), str(r.get("priority", "-")), plugin, r["smoke"], r["detail"]])
  print(_table(table))
  if default is None: print(f"\nno default device: {default_error}")
  else:
    print(f"\n* default device: {default}" + (f" (DEV={dev_env})" if dev_env else " (highest-priority available device)"))
    if fallback: print("  a fallback, because: " + "; ".join(fallback))
  return 1 if failed else 0


def cmd_viz(path: str | None, port: int | None) -> int:
  from plugrad import trace
  from plugrad.viz.server import TraceFileError, serve
  try: serve(path or trace.default_trace_file(), int(trace.VIZ_PORT) if port is None else port)
  except (TraceFileError, OSError) as e:
    print(f"plugrad viz: {e}", file=sys.stderr)
    return 2
  return 0


def cmd_conformance(device: str, tiers: str | None, report_file: str | None, json_file: str | None, extra: Sequence[str]) -> int:
  for path in (report_file, json_file):
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
      print(f"plugrad conformance: cannot write {path}: no such directory", file=sys.stderr)
      return 2
  if importlib.util.find_spec("pytest") is None:
    print("plugrad conformance: the conformance suite runs under pytest, which is not installed (pip install pytest)", file=sys.stderr)
    return 2
  from plugrad.testing.report import ConformanceArgumentError, markdown, run_conformance
  try: report = run_conformance(device, tiers, extra)
  except ConformanceArgumentError as e:
    print(f"plugrad conformance: {e}", file=sys.stderr)
    return 2
  text = markdown(report)
  print(text, end="")
  if report_file is not None: pathlib.Path(report_file).write_text(text)
  if json_file is not None: pathlib.Path(json_file).write_text(json.dumps(report, indent=2) + "\n")
  return int(report["returncode"])


def cmd_new_backend(name: str, out: str) -> int:
  from plugrad.scaffold import ScaffoldError, names, write_skeleton
  try:
    device = names(name)["NAME"]
    if device in Device:  # a second plugin claiming a name makes it unusable for both
      print(f"plugrad new-backend: {device} is already a device here ({Device.manager.entry(device).plugin.label}): choose another name",
            file=sys.stderr)
      return 2
    root = write_skeleton(name, pathlib.Path(out))
  except (ScaffoldError, OSError) as e:
    print(f"plugrad new-backend: {e}", file=sys.stderr)
    return 2
  print(f"wrote {root}/ (device {device}):")
  for f in sorted(p for p in root.rglob("*") if p.is_file()): print(f"  {f.relative_to(root)}")
  print(f"next: pip install -e {root} && python -m plugrad conformance {device} --tiers render   (then see {root / 'README.md'})")
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m plugrad", description="Inspect plugrad's backend plugins and devices.")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("plugins", help="list the backend plugins: distribution, version, plugin API, status, devices")
  p.add_argument("--json", action="store_true", help="print JSON instead of a table")
  d = sub.add_parser("devices", help="smoke-test each device (render, compile and run a tiny kernel): PASS or FAIL with the reason")
  d.add_argument("--json", action="store_true", help="print JSON instead of a table")
  d.add_argument("names", nargs="*", metavar="NAME", help="only these devices (e.g. PYTHON, CUDA:1)")
  v = sub.add_parser("viz", help="serve a trace recorded with VIZ=1 (or VIZ=2) as a local web page (docs/viz.md)")
  v.add_argument("trace", nargs="?", metavar="TRACE_FILE", help="the trace file (default: the last one VIZ saved, or $VIZ_FILE)")
  v.add_argument("--port", type=int, default=None, help="the port to serve on (default $VIZ_PORT, else 8128; 0: any free port)")
  from plugrad.replay import add_parser as add_replay_parser
  add_replay_parser(sub)
  from plugrad.export.cli import add_parser as add_export_parser
  add_export_parser(sub)
  from plugrad.onnx.cli import add_parser as add_onnx_parser
  add_onnx_parser(sub)
  c = sub.add_parser("conformance", help="run the conformance suite on one device: a Markdown report per tier (pytest args after --)")
  c.add_argument("device", metavar="DEVICE", help="the device to check (e.g. CPU, CUDA:1)")
  c.add_argument("--tiers", default=None, help="comma-separated subset of render,compile,emulate,run (default: all; without run where the "
                                                "device is unavailable here)")
  c.add_argument("--report", default=None, metavar="FILE.md", help="also write the Markdown report to this file")
  c.add_argument("--json", default=None, dest="json_file", metavar="FILE.json", help="write the report as JSON to this file")
  n = sub.add_parser("new-backend", help="write a minimal backend plugin to start from: DIR/plugrad-<name>/")
  n.add_argument("name", metavar="NAME", help="the device name (a letter, then letters, digits, underscores): vulkan gives VULKAN")
  n.add_argument("--out", default=".", metavar="DIR", help="where to create plugrad-<name>/ (default: the current directory)")
  argv, extra = list(sys.argv[1:] if argv is None else argv), []
  if argv[:1] == ["conformance"] and "--" in argv:  # the rest goes to the child pytest untouched (argparse would read its options)
    argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  args = parser.parse_args(argv)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)  # failures are part of the report
    try:
      if args.command == "viz": return cmd_viz(args.trace, args.port)
      if args.command == "replay":
        from plugrad.replay import run_cli
        return run_cli(args)
      if args.command == "export":
        from plugrad.export.cli import run_cli as run_export
        return run_export(args)
      if args.command == "onnx":
        from plugrad.onnx.cli import run_cli as run_onnx
        return run_onnx(args)
      if args.command == "plugins": return cmd_plugins(args.json)
      if args.command == "conformance": return cmd_conformance(args.device, args.tiers, args.report, args.json_file, extra)
      if args.command == "new-backend": return cmd_new_backend(args.name, args.out)
      return cmd_devices(args.json, args.names)
    except DeviceError as e:  # PLUGRAD_STRICT_PLUGINS=1 turned a plugin failure into a fatal one
      print(f"plugrad: {type(e).__name__}: {e}", file=sys.stderr)
      return 1
    except ValueError as e:  # a malformed PLUGRAD_* setting
      print(f"plugrad: {e}", file=sys.stderr)
      return 2


if __name__ == "__main__":
  sys.exit(main())
