"""Flax integration: the orthonormal initializer, projection, the soft penalty and QK-norm.

Flax linen ``MultiHeadDotProductAttention`` and ``nnx.MultiHeadAttention`` keep the
query and key projections at paths ending in ``query/kernel`` and ``key/kernel`` with
shape ``(d_model, num_heads, head_dim)``: the default :class:`stiefax.FrameSpec` views
each as one ``St(d_model, head_dim)`` frame per head. Which parameters are frames, and
how each is viewed, is read from their names by :mod:`stiefax.layouts`.

The three-line drop-in (linen params or ``nnx.Optimizer(model, tx, wrt=nnx.Param)``)::

    params = stiefax.flax.project_params(params, stiefax.layouts.qk_labels)
    tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
    opt_state = tx.init(params)
"""

from stiefax._flax import NnxQKNorm
from stiefax._flax import QKNorm
from stiefax._flax import orthogonality_penalty
from stiefax._flax import orthonormal_init
from stiefax._flax import project_params

__all__ = [
  "orthonormal_init",
  "project_params",
  "orthogonality_penalty",
  "QKNorm",
  "NnxQKNorm",
]
