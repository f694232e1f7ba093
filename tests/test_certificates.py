"""Every float64 certificate passes, and fails once its check is made vacuous."""

import inspect
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stiefax
from stiefax import certificates
from stiefax.certificates import _core
from stiefax.certificates import _problems
from stiefax.experiments import cli

NAMES = [f.__name__ for f in certificates.CERTIFICATES]


@pytest.fixture(scope="module")
def results():
  # Module-scoped fixtures run before the per-test strict promotion: set it here too.
  with jax.numpy_rank_promotion("raise"):
    return {c.name: c for c in certificates.run_all(seed=0)}


def test_at_least_24_distinct_checks_cover_every_proposition(results):
  assert len(results) == len(NAMES) >= 24
  assert sorted(results) == sorted(NAMES)  # one record per function, named after it
  props = {c.proposition.split(" ")[0].split("(")[0] for c in results.values()}
  assert props == {"1", "2", "3", "6", "7", "8", "10", "mMuon", "retraction"}
  assert any("Jensen" in c.proposition for c in results.values())
  assert set(certificates.__all__) >= set(NAMES) | {"Certificate", "run_all"}


@pytest.mark.parametrize("name", NAMES)
def test_certificate_passes_with_a_control_far_above_tolerance(results, name):
  c = results[name]
  assert isinstance(c, certificates.Certificate)
  assert c.passed, c
  expected = certificates.OPTIMUM_TOLERANCE if name == "mmuon_optimum" else certificates.TOLERANCE
  assert 0.0 <= c.residual <= c.tolerance == expected
  assert c.control >= certificates.CONTROL_MARGIN * c.tolerance
  assert np.isfinite(c.residual) and np.isfinite(c.control)


@pytest.mark.parametrize("cert", certificates.CERTIFICATES, ids=NAMES)
def test_vacuous_check_fails(cert):
  with jax.numpy_rank_promotion("raise"):
    c = cert(0, vacuous=True)
  assert not c.passed
  assert c.residual > c.tolerance
  assert c.residual == c.control


def test_float64_regardless_of_the_global_setting(results):
  before = jax.config.jax_enable_x64
  with jax.enable_x64(False):
    c = certificates.grassmann_split()
    assert not jax.config.jax_enable_x64  # the checks never switch it on for the caller
  assert jax.config.jax_enable_x64 == before
  # float32 arithmetic would leave residuals of ~1e-7 in these identities.
  assert c.residual < 1e-13
  for name in ("joint_gauge_gradient", "scalar_moment_equivariance", "adam_degree_zero"):
    assert results[name].residual < 1e-13


def test_passing_needs_a_control_that_fails():
  assert _core.record("x", "1", 0.0, 1.0).passed
  assert not _core.record("x", "1", 0.0, 1e-9).passed  # control too small
  assert not _core.record("x", "1", 1e-9, 1.0).passed  # residual too large


@pytest.mark.slow  # every certificate again, at another seed
def test_another_seed_also_passes():
  with jax.numpy_rank_promotion("raise"):
    out = certificates.run_all(seed=3)
  assert all(c.passed for c in out), [c for c in out if not c.passed]


def test_gauge_check_fails_on_a_random_pair_and_passes_on_a_true_gradient(x64):
  rng = np.random.default_rng(0)
  d, h, r = _problems.D, _problems.H, _problems.R
  pair = (rng.standard_normal((d, h, r)), rng.standard_normal((d, h, r)))
  bad = certificates.joint_gauge_gradient(grads=pair)
  assert not bad.passed and bad.residual > 0.1
  # The certificate's own problem, differentiated independently of its code path.
  p, _ = _problems.attention_problem(0)
  grads = jax.grad(_problems.attention_loss, argnums=(3, 4))(p.x, p.w_v, p.target, p.w_q, p.w_k)
  good = certificates.joint_gauge_gradient(grads=grads)
  assert good.passed and good.residual < 1e-13


def test_angle_check_fails_uncapped_and_passes_under_a_tighter_cap():
  uncapped = certificates.angle_bound(max_norm=None)
  assert not uncapped.passed and uncapped.residual > 0.3  # about 45 - 13.8 degrees
  assert certificates.angle_bound(max_norm=0.05).passed


def test_equivariance_check_fails_for_the_elementwise_moment():
  naive = stiefax.riemannian_adam(0.03, moment="elementwise")
  c = certificates.scalar_moment_equivariance(tx=naive)
  assert not c.passed and c.residual > 1e-6
  assert certificates.scalar_moment_equivariance(tx=stiefax.riemannian_sgd(0.02)).passed


def test_lift_recovers_the_tangent_step(x64):
  rng = np.random.default_rng(1)
  w = _problems.haar(rng, (2, 9, 3))
  g = rng.standard_normal(w.shape)
  eta = g - w @ _problems.sym(np.swapaxes(w, -1, -2) @ g)  # tangent, with a gauge part
  u = np.asarray(stiefax.geometry.polar(jnp.asarray(w + eta), "newton_schulz"))
  lifted = _problems.lift(w, u)
  np.testing.assert_allclose(lifted, eta, atol=1e-12)
  # Control: a normal step is not recovered (polar(W - W / 2) = W lifts to 0).
  normal = -0.5 * w
  back = _problems.lift(w, np.asarray(stiefax.geometry.polar(jnp.asarray(w + normal))))
  assert np.max(np.abs(back)) < 1e-12 and np.max(np.abs(back - normal)) > 0.1


def test_certify_command_prints_the_table_and_exits_0(results, capsys, tmp_path):
  out_json = tmp_path / "certs.json"
  rc = cli.main(["certify", "--json", str(out_json)])
  out = capsys.readouterr().out
  assert rc == 0
  rows = [line for line in out.splitlines() if line.endswith("PASS")]
  assert len(rows) == len(NAMES) >= 24
  assert "FAIL" not in out
  assert f"{len(NAMES)}/{len(NAMES)} checks pass" in out
  assert [r["name"] for r in json.loads(out_json.read_text())] == NAMES


def test_certify_command_exits_1_when_a_check_fails(results, capsys, monkeypatch):
  def grassmann_split(seed):
    return certificates.grassmann_split(seed, vacuous=True)

  monkeypatch.setattr(certificates, "CERTIFICATES", (certificates.decay_is_normal, grassmann_split))
  assert cli.main(["certify"]) == 1
  out = capsys.readouterr().out
  assert "1/2 checks pass" in out and out.count("FAIL") == 1


def test_certify_command_errors(capsys):
  assert cli.main(["certify", "--only", "no_such_check"]) == 2
  err = capsys.readouterr().err
  assert "unknown check 'no_such_check'" in err and "Traceback" not in err
  assert cli.main(["certify", "--only", "grassmann_split", "--only", "decay_is_normal"]) == 0
  out = capsys.readouterr().out
  assert "2/2 checks pass" in out


# ----------------------------------------------------------------------------
# The registry: each certificate is named once, by its decorated function.
# ----------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRIES = _core.registered()


def _table_rows(text, start, stop):
  """``(name, proposition)`` rows of a printed certificate table between two markers."""
  block = text[text.index(start) : text.index(stop, text.index(start))]
  rows = re.findall(r"^\s*([a-z]\w+)\s{2,}(\S.*?)\s{2,}[\d.]+e[-+]\d+\s", block, re.MULTILINE)
  return [(name, prop.strip()) for name, prop in rows if name != "check"]


def test_registered_names_are_unique_and_each_appears_once_in_certificates():
  names = [e.name for e in ENTRIES]
  assert len(names) == len(set(names)) >= 24
  assert [f.__name__ for f in certificates.CERTIFICATES] == names
  assert [e.function for e in ENTRIES] == list(certificates.CERTIFICATES)
  for e in ENTRIES:
    assert NAMES.count(e.name) == 1
    assert certificates.__all__.count(e.name) == 1
    assert getattr(certificates, e.name) is e.function
    assert e.function.__module__.startswith("stiefax.certificates._")
  assert len(certificates.__all__) == len(set(certificates.__all__))


def test_every_certificate_docstring_states_its_proposition():
  for e in ENTRIES:
    doc = inspect.getdoc(e.function)
    assert doc and doc.split("\n")[0].strip(), e.name
    # The example prints the record's proposition: ('6(ii)', True).
    assert f"{e.proposition!r}, True" in doc, e.name
    number = re.match(r"(\d+)(\([iv]+\))?", e.proposition)
    if number:  # the prose names it too: "Proposition 6(ii)", "Prop. 10", "Props. 8, 10"
      prop = re.escape(number.group(0))
      assert re.search(rf"Prop(?:osition|s?\.)\s+(?:\d+,\s*)*{prop}(?!\d)", doc), e.name
    assert "vacuous:" in doc and "Returns:" in doc, e.name


def test_the_documented_tables_list_the_registered_certificates_in_order():
  registered = [(e.name, e.proposition) for e in ENTRIES]
  docs = (ROOT / "docs" / "reproduction.md").read_text()
  assert _table_rows(docs, "$ stiefax certify", "checks pass") == registered
  # The measured table lives in the docs only; the docstring points to it.
  assert "docs/reproduction.md" in certificates.__doc__
  assert not re.search(r"\d\.\de[-+]\d\d", certificates.__doc__)  # no measured residual


def test_the_registry_rejects_a_second_name_and_a_missing_vacuous(monkeypatch):
  monkeypatch.setattr(_core, "_REGISTRY", {})

  @_core.certificate("2", tolerance=1e-3)
  def toy(seed: int = 0, *, vacuous: bool = False) -> certificates.Certificate:
    """A toy check of Proposition 2."""
    return _core.certify(lambda control: 1.0 if control else 1e-4 * (seed + 1), vacuous)

  c = toy(0)
  assert c == certificates.Certificate("toy", "2", 1e-4, 1e-3, 1.0, True)
  assert not toy(0, vacuous=True).passed
  assert toy(9).passed and not toy(10).passed  # residual 1e-3 is accepted, 1.1e-3 is not
  assert [e.name for e in _core.registered()] == ["toy"]
  with pytest.raises(ValueError, match="'toy' is registered twice"):
    _core.certificate("2")(toy.__wrapped__)

  def no_vacuous(seed: int = 0) -> certificates.Certificate:
    """Proposition 2."""
    raise AssertionError

  with pytest.raises(ValueError, match="vacuous"):
    _core.certificate("2")(no_vacuous)
  with pytest.raises(RuntimeError, match="@certificate"):
    _core.certify(lambda control: 0.0, False)
