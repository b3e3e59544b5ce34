"""Conformance: every suite kernel at every tier (parametrized by the plugrad pytest plugin)."""
import pytest

from plugrad.testing.harness import check_kernel

pytestmark = pytest.mark.plugrad_conformance


def test_kernel(conformance_kernel, conformance_builder, tier, plugrad_dev):
  check_kernel(plugrad_dev, conformance_builder, tier)
