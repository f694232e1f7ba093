"""Shared fixtures: float64 per test, strict promotion, seeded frames; xdist groups."""

import jax
import numpy as np
import pytest

# Modules whose tests share an expensive module-scoped fixture (a trained run, a data
# set, a compiled example): under ``pytest -n 2 --dist loadgroup`` (the README's
# command; ``--dist loadgroup`` is in addopts) each runs on one worker, so the
# fixture is built once.
SHARED_FIXTURE_MODULES = frozenset(
  {
    "test_grok",
    "test_patches",
    "test_patch_data",
    "test_examples",
    "test_certificates",
  }
)
# Modules whose cases share ``functools.cache``d steps per case name (tests/cases.py):
# each case's tests run on one worker.
PER_CASE_MODULES = frozenset({"test_common"})


def pytest_itemcollected(item):
  # Marked as each item is collected: before any collection_modifyitems hook (xdist's
  # own reads the groups there).
  mod = getattr(item, "module", None)  # doctest items have none
  module = mod.__name__.rsplit(".", 1)[-1] if mod is not None else ""
  if module in SHARED_FIXTURE_MODULES:
    item.add_marker(pytest.mark.xdist_group(module))
  elif module in PER_CASE_MODULES:
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("name") if callspec is not None else None
    if name is not None:
      item.add_marker(pytest.mark.xdist_group(f"{module}-{name}"))


@pytest.fixture(scope="session")
def cifar(tmp_path_factory):
  """A small CIFAR-10 python-format folder and archive (tests.harness.write_cifar),
  written once per test process and shared by the data and patch tests."""
  from tests import harness  # the experiments extra; imported only where it is used

  return harness.write_cifar(tmp_path_factory.mktemp("cifar"))


@pytest.fixture
def x64():
  """Runs the test with 64-bit JAX types enabled (never enabled globally)."""
  with jax.enable_x64(True):
    yield


@pytest.fixture
def rng():
  return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _strict_rank_promotion():
  with jax.numpy_rank_promotion("raise"):
    yield
