"""Shared fixtures: float64 per test, strict promotion, seeded frames, shared runs."""

import jax
import numpy as np
import pytest

from tests import multiprocess_harness


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


@pytest.fixture(scope="session")
def multiprocess_runs(tmp_path_factory):
  """The shared two-process and one-process runs of tests/multiprocess_harness.py."""
  multiprocess_harness.needs_orbax()
  return multiprocess_harness.first_phase(tmp_path_factory.mktemp("multiprocess"))
