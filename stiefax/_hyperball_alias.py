"""AdamH and MuonH: :func:`stiefax.hyperball` on the hidden matrices, AdamW on the rest.

The ready optimizers of Wen et al. (2026) over the wrapper of ``stiefax._hyperball``:
``optax.partition`` of the matrices that :func:`stiefax.labels.matrix_labels` marks
(held on their spheres) and of everything else (AdamW).
"""

from __future__ import annotations

from typing import Any
from typing import Optional

import chex
import jax
import optax

from stiefax import _checks
from stiefax._hyperball import HYPERBALL_LABEL
from stiefax._hyperball import REST_LABEL
from stiefax._hyperball import hyperball
from stiefax._hyperball import matrix_labels
from stiefax._hyperball import muon_dimension_numbers
from stiefax._layouts import decay_mask

__all__ = ["adamh", "muonh"]


def _partition(
  name: str,
  sphere: optax.GradientTransformation,
  rest: optax.GradientTransformation,
  labels: Any,
) -> optax.GradientTransformation:
  """``optax.partition`` of the hidden matrices (``sphere``) and the rest (``rest``),
  refusing a label tree that holds no matrix."""
  resolve = matrix_labels if labels is None else labels

  def label_fn(params: optax.Params) -> Any:
    tree = resolve(params) if callable(resolve) else resolve
    flat = jax.tree.leaves(tree)
    if not any(lab == HYPERBALL_LABEL for lab in flat):
      raise ValueError(
        f"stiefax.{name}: no parameter is labelled {HYPERBALL_LABEL!r} (a hidden matrix"
        " of rank >= 2 whose name is not an embedding's); give labels= a tree or a"
        f" callable marking the matrices to hold at a constant norm."
      )
    return tree

  tx = optax.partition({HYPERBALL_LABEL: sphere, REST_LABEL: rest}, label_fn)
  return _checks.named_init(tx, f"stiefax.{name}")  # its errors name adamh / muonh


def _rest(
  rest_learning_rate: optax.ScalarOrSchedule,
  b1: chex.Numeric,
  b2: chex.Numeric,
  eps: chex.Numeric,
  weight_decay: chex.Numeric,
  nesterov: bool = False,
) -> optax.GradientTransformation:
  """AdamW on the parameters off the spheres, decayed on rank >= 2 leaves only."""
  return optax.adamw(
    rest_learning_rate,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    mask=decay_mask,
    nesterov=nesterov,
  )


def adamh(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rest_learning_rate: Optional[optax.ScalarOrSchedule] = None,
  b1: chex.Numeric = 0.9,
  b2: chex.Numeric = 0.999,
  eps: chex.Numeric = 1e-8,
  weight_decay: chex.Numeric = 1e-4,
  radius: Optional[chex.Numeric] = None,
  frames: Any = None,
  labels: Any = None,
  nesterov: bool = False,
) -> optax.GradientTransformation:
  """AdamH: :func:`hyperball` over Adam on the hidden matrices, AdamW on the rest.

  ``optax.partition`` of

  * ``"hyperball"`` (:func:`stiefax.labels.matrix_labels`: the matrices of rank >= 2
    that are not embeddings or output heads): ``hyperball(optax.scale_by_adam(b1, b2,
    eps, nesterov=nesterov), learning_rate, radius=radius, frames=frames)``, that is
    ``W <- R Normalize(W - eta R Normalize(m_hat / (sqrt(v_hat) + eps)))`` per matrix
    (Wen et al. 2026, section 2), no weight decay;
  * ``"adamw"``: ``optax.adamw(rest_learning_rate, b1, b2, eps, weight_decay,
    mask=stiefax.layouts.decay_mask)`` on embeddings, vectors and scalars.

  ``learning_rate`` is the relative step of the matrices (each moves by ``eta R``
  before the renormalization); ``rest_learning_rate`` (default ``learning_rate``, as
  ``optax.contrib.muon`` does) is AdamW's absolute rate. The paper's rule of thumb
  from an AdamW run at rate ``lr`` and decay ``lambda`` is ``eta = sqrt(lr lambda)``.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> params = {"mlp": {"w": jnp.ones((8, 4)) / 4}, "scale": jnp.zeros(4)}
    >>> tx = stiefax.adamh(0.02, rest_learning_rate=1e-3)
    >>> u, _ = tx.update(
    ...     jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    >>> jax.tree.map(lambda x: x.shape, u)
    {'mlp': {'w': (8, 4)}, 'scale': (4,)}

  Args:
    learning_rate: ``eta`` of the matrices, a float or a schedule.
    rest_learning_rate: AdamW's rate on everything else (default ``learning_rate``).
    b1: Adam's first-moment decay (both parts).
    b2: Adam's second-moment decay (both parts).
    eps: Adam's eps (both parts).
    weight_decay: AdamW's decoupled decay on the rest (rank >= 2 leaves: embeddings).
    radius: ``None`` (each matrix keeps its initial norm) or every matrix's ``R``.
    frames: which entries form one matrix (:func:`hyperball`).
    labels: a label tree or ``params -> label tree`` with ``"hyperball"`` on the
      matrices to hold and ``"adamw"`` elsewhere (default :func:`matrix_labels`).
    nesterov: Nesterov momentum in both parts.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_hyperparams("adamh", b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  rest_lr = learning_rate if rest_learning_rate is None else rest_learning_rate
  _checks.check_hyperparams("adamh", learning_rate=rest_lr)
  sphere = hyperball(
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps, nesterov=nesterov),
    learning_rate,
    radius=radius,
    frames=frames,
  )
  rest = _rest(rest_lr, b1, b2, eps, weight_decay, nesterov)
  return _partition("adamh", sphere, rest, labels)


def muonh(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rest_learning_rate: Optional[optax.ScalarOrSchedule] = None,
  beta: chex.Numeric = 0.95,
  ns_steps: int = 5,
  nesterov: bool = True,
  b1: chex.Numeric = 0.9,
  b2: chex.Numeric = 0.999,
  eps: chex.Numeric = 1e-8,
  weight_decay: chex.Numeric = 1e-4,
  radius: Optional[chex.Numeric] = None,
  frames: Any = None,
  labels: Any = None,
) -> optax.GradientTransformation:
  """MuonH: :func:`hyperball` over Muon's direction on the hidden matrices, AdamW on the rest.

  As :func:`adamh` with ``optax.contrib.scale_by_muon(ns_steps=ns_steps, beta=beta,
  nesterov=nesterov)`` as the base: ``u_t`` is the Newton-Schulz orthogonalization of
  the momentum, per matrix, and

      W <- R Normalize(W - eta R Normalize(u_t))

  (Wen et al. 2026, section 2). Muon's matrices are those of ``frames`` (default
  :func:`stiefax.layouts.matrix_frames`: each frame's rows are Muon's reduction axis,
  its columns the output axes), so the sphere and the orthogonalization see the same
  matrix. ``b1``, ``b2``, ``eps``, ``weight_decay`` and ``rest_learning_rate`` are
  those of the AdamW on embeddings, vectors and scalars.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> params = {"mlp": {"w": jnp.eye(8, 4)}, "scale": jnp.zeros(4)}
    >>> tx = stiefax.muonh(0.02, rest_learning_rate=1e-3)
    >>> g = jax.tree.map(lambda p: jnp.ones_like(p) + p, params)
    >>> u, _ = tx.update(g, tx.init(params), params)
    >>> w = optax.apply_updates(params, u)["mlp"]["w"]
    >>> round(float(jnp.linalg.norm(w)), 4)       # ||eye(8, 4)|| = 2
    2.0

  Args:
    learning_rate: ``eta`` of the matrices, a float or a schedule.
    rest_learning_rate: AdamW's rate on everything else (default ``learning_rate``).
    beta: Muon's momentum decay.
    ns_steps: Newton-Schulz iterations.
    nesterov: Nesterov momentum in Muon.
    b1: AdamW's first-moment decay, on the rest.
    b2: AdamW's second-moment decay, on the rest.
    eps: AdamW's eps, on the rest.
    weight_decay: AdamW's decoupled decay on the rest (rank >= 2 leaves).
    radius: ``None`` (each matrix keeps its initial norm) or every matrix's ``R``.
    frames: which entries form one matrix.
    labels: as in :func:`adamh`.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_hyperparams(
    "muonh", b1=b1, b2=b2, beta=beta, eps=eps, weight_decay=weight_decay, ns_iterations=ns_steps
  )
  rest_lr = learning_rate if rest_learning_rate is None else rest_learning_rate
  _checks.check_hyperparams("muonh", learning_rate=rest_lr)
  base = optax.contrib.scale_by_muon(
    ns_steps=ns_steps,
    beta=beta,
    nesterov=nesterov,
    weight_dimension_numbers=muon_dimension_numbers(frames),
  )
  sphere = hyperball(base, learning_rate, radius=radius, frames=frames)
  return _partition("muonh", sphere, _rest(rest_lr, b1, b2, eps, weight_decay), labels)
