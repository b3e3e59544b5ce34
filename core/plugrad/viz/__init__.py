"""VIZ: a local web page over a trace (plugrad/trace.py) of a run: kernels, rewrites, programs, launches and memory.

`VIZ=1 python script.py` records and serves at exit; `python -m plugrad viz [--port N] [TRACE_FILE]` reopens a saved
trace. The page is static HTML/JS in `static/` (no build step, no network) over the JSON endpoints of `server.py`.
"""
