"""VIZ in a real browser: playwright driving the system's Chromium, headless, over a trace of examples/train_digits.py.

Needs `pip install playwright` and a Chromium binary (apt `chromium`; PLUGRAD_CHROMIUM=path to use another); skipped
with the reason otherwise. VIZ_SCREENSHOT_DIR=dir keeps the screenshots (docs/viz/ is made that way).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.viz.server import load_trace, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
RUN_LINE = re.compile(r"\S+\s+\S+\s+global \(.*?\)\s+local \(.*?\)\s+[\d.]+ us")
CODEGEN = re.compile(r"codegen (\S+)\s+opts ")  # searched, not matched: the progress bar shares the lines


def _chromium() -> str | None:
  for c in (os.environ.get("PLUGRAD_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"),
            shutil.which("google-chrome")):
    if c and os.path.isfile(c) and os.access(c, os.X_OK): return c
  return None


sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install playwright)")
CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium, or set PLUGRAD_CHROMIUM)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """examples/train_digits.py --smoke recorded with VIZ=2 and DEBUG=2: the trace, and the kernels and launches it printed."""
  pytest.importorskip("sklearn", reason="the example needs scikit-learn")
  tmp = tmp_path_factory.mktemp("viz")
  env = {k: v for k, v in os.environ.items() if k not in ("VIZ", "DEBUG", "PLUGRAD_REPLAY_DB")}
  env.update(VIZ="2", DEBUG="2", VIZ_FILE=str(tmp / "digits.json"), DEV="CPU")
  out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), "--smoke"], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  compiled = [m[1] for ln in lines if (m := CODEGEN.search(ln))]
  launches = [ln for ln in lines if RUN_LINE.search(ln)]
  return str(tmp / "digits.json"), compiled, launches


@pytest.fixture(scope="module")
def viz_page(run):
  server, _ = serve_in_thread(run[0])
  errors: list[str] = []
  with sync_api.sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
    pg = browser.new_page(viewport={"width": 1400, "height": 900})
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.goto(f"http://127.0.0.1:{server.server_port}/")
    pg.wait_for_selector("body[data-ready='1']", timeout=30000)
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    browser.close()
  server.shutdown()


def _shot(viz_page, name, tmp_path):
  d = Path(os.environ.get("VIZ_SCREENSHOT_DIR") or tmp_path)
  d.mkdir(parents=True, exist_ok=True)
  viz_page.screenshot(path=str(d / f"{name}.png"))
  assert (d / f"{name}.png").stat().st_size > 1000


def test_page_loads_without_errors_and_lists_the_runs_kernels(viz_page, run, tmp_path):
  path, compiled, _ = run
  names = viz_page.locator(".kernel-item .name").all_inner_texts()
  assert names == compiled  # every kernel the run compiled, in the order it compiled them
  assert names == [k["name"] for k in load_trace(path)["kernels"]]
  assert viz_page.errors == []
  _shot(viz_page, "kernels", tmp_path)


def test_clicking_a_kernel_shows_its_graph_and_source(viz_page, run, tmp_path):
  trace = load_trace(run[0])
  i = max(range(len(trace["kernels"])), key=lambda j: len(trace["kernels"][j]["nodes"]) if trace["kernels"][j]["passes"] else 0)
  k = trace["kernels"][i]
  viz_page.locator(".kernel-item").nth(i).click()
  viz_page.wait_for_selector(f"#kernel-name:has-text('{k['name']}')")
  svg = viz_page.locator(".graphbox svg").first
  svg.wait_for()
  ast_nodes = int(svg.get_attribute("data-nodes"))
  assert ast_nodes == viz_page.locator(".graphbox svg .node").count() > 3
  _shot(viz_page, "graph", tmp_path)
  viz_page.locator("#sub-source").click()
  src = viz_page.locator("#source")
  assert src.inner_text().strip() == k["source"].strip()
  assert src.locator("span.tok-kw").count() > 0 and src.locator("span.tok-num").count() > 0  # highlighted
  _shot(viz_page, "source", tmp_path)
  viz_page.locator("#sub-linear").click()
  assert viz_page.locator("#linear").inner_text().splitlines()[0].split()[1] == k["linear"][0].split()[1]
  viz_page.locator("#sub-graph").click()
  assert viz_page.errors == []


def test_stepping_through_rewrites_changes_the_graph(viz_page, run, tmp_path):
  trace = load_trace(run[0])
  i, p = next((j, pi) for j, k in enumerate(trace["kernels"]) for pi, ps in enumerate(k["passes"]) if len(ps["steps"]) >= 3)
  viz_page.locator(".kernel-item").nth(i).click()
  viz_page.wait_for_selector(".gitem.pass")
  viz_page.locator(".gitem.pass").nth(p).click()
  assert "input of" in viz_page.locator("#step-label").inner_text()
  seen = []
  for step in range(3):
    viz_page.locator("#step-next").click()
    assert viz_page.locator("#step-label").inner_text() == f"rewrite {step + 1} of {len(trace['kernels'][i]['passes'][p]['steps'])}"
    rule = viz_page.locator("#rule").inner_text()
    assert rule.startswith("UPat(") and trace["kernels"][i]["passes"][p]["steps"][step]["rule"] in rule
    assert viz_page.locator("#before svg .node.fired").count() == 1  # the node the rule fired on is highlighted
    roots = (viz_page.locator("#before svg").get_attribute("data-root"), viz_page.locator("#after svg").get_attribute("data-root"))
    assert roots[0] != roots[1]
    seen.append(roots)
  assert len(set(seen)) > 1  # each step shows another rewrite
  _shot(viz_page, "rewrite", tmp_path)
  viz_page.keyboard.press("ArrowLeft")
  assert viz_page.locator("#step-label").inner_text().startswith("rewrite 2 of")
  assert viz_page.errors == []


def test_timeline_shows_every_launch(viz_page, run, tmp_path):
  _, _, launches = run
  viz_page.locator("#tab-timeline").click()
  bars = viz_page.locator("#timeline-svg rect.launch")
  assert bars.count() == len(launches) == len(load_trace(run[0])["launches"])
  before = bars.first.get_attribute("width")
  viz_page.locator("#tl-zoom-in").click()
  viz_page.locator("#tl-zoom-in").click()
  assert float(bars.first.get_attribute("width")) > float(before) or float(before) <= 1  # zooming widens the bars
  viz_page.locator("#tl-reset").click()
  _shot(viz_page, "timeline", tmp_path)
  assert viz_page.errors == []


def test_memory_view_shows_the_jit_plan(viz_page, run, tmp_path):
  trace = load_trace(run[0])
  viz_page.locator("#tab-memory").click()
  assert viz_page.locator(".memplan").count() == len(trace["memory"]) >= 1  # the example's TinyJit captured its step
  assert viz_page.locator("svg .membuf").count() == sum(len(m["buffers"]) for m in trace["memory"])
  _shot(viz_page, "memory", tmp_path)
  assert viz_page.errors == []
