# Every compiler stage is validated in tests; set before plugrad is imported anywhere.
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

pytest_plugins = ["pytester", "tests.differential.report"]  # the differential tester's summary (docs/testing.md)
