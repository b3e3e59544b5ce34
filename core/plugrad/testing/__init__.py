"""The plugrad conformance suite, shipped in the wheel so that any backend can be checked against it:

    pytest --pyargs plugrad.testing --plugrad-device=NAME [--plugrad-tiers=render,compile,emulate,run]

Tests are gated by the capabilities the device declares and by tier (see `harness.py`); a plugin declares expected
failures with the `plugrad_conformance_xfails` hook. The pytest plugin is `plugrad.testing.pytest_plugin`.
"""
