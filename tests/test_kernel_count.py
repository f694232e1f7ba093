"""The compiled update's kernels do not grow with depth: one batched pass per frame group.

On a GPU a small optimizer update is bound by kernel launches. A model written layer by
layer has two frame leaves per layer; updated one leaf at a time, the Stiefel part of
``stiefel_adamw`` (its kernels beyond ``optax.adamw``'s on the same tree) grows with the
number of layers, and grouped it must not. Counted from abstract shapes on the CPU
backend, so no device and no arrays are needed.
"""

import functools

import optax
import pytest

from benchmarks import kernels
import stiefax


@functools.cache
def _adamw(layers):
  return sum(kernels.count(optax.adamw(1e-3), kernels.gpt2_tree(layers)).values())


def _grouped():
  # The program an accelerator runs (the CPU's default updates one leaf at a time).
  return stiefax.stiefel_adamw(
    1e-3, stiefel=functools.partial(stiefax.riemannian_adam, group_frames=True)
  )


def _stiefel_part(make, layers):
  return sum(kernels.count(make(), kernels.gpt2_tree(layers)).values()) - _adamw(layers)


@pytest.mark.timeout(120)
def test_stiefel_kernels_of_a_gpt2_small_tree_do_not_grow_with_depth():
  one = _stiefel_part(_grouped, 1)
  twelve = _stiefel_part(_grouped, 12)
  assert 0 < twelve <= 2 * one, (one, twelve)
  # Control: one pass per leaf (the same update) grows with depth past that bound.
  per_leaf = functools.partial(stiefax.riemannian_adam, group_frames=False)
  one_pl = _stiefel_part(lambda: stiefax.stiefel_adamw(1e-3, stiefel=per_leaf), 1)
  three_pl = _stiefel_part(lambda: stiefax.stiefel_adamw(1e-3, stiefel=per_leaf), 3)
  assert three_pl > 2 * one_pl, (one_pl, three_pl)


def test_entry_kernels_skips_what_does_not_run():
  hlo = """HloModule m

ENTRY %main (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  %c = f32[] constant(0)
  %b = f32[2]{0} bitcast(%p)
  %f = f32[2]{0} fusion(%b, %c), kind=kLoop, calls=%fc
  %d = f32[2,2]{1,0} dot(%f, %f), lhs_contracting_dims={}
  ROOT %t = (f32[2]{0}, f32[2,2]{1,0}) tuple(%f, %d)
}
"""
  assert dict(kernels.entry_kernels(hlo)) == {"fusion": 1, "dot": 1}
