"""The installed library imports and takes a step (run by .ci/package.sh, outside the
repository, with or without the experiments extra): one ``stiefel_adamw`` update of a
query kernel leaves it orthonormal."""

import pathlib

import jax
import jax.numpy as jnp
import optax

import stiefax

here = pathlib.Path(stiefax.__file__).resolve()
assert "site-packages" in here.parts, f"stiefax imported from {here}, not the install"

d, heads, r = 16, 2, 4
params = {"attn": {"query": {"kernel": jax.random.normal(jax.random.key(0), (d, heads, r))}}}
params = stiefax.flax.project_params(params)
tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05)
state = tx.init(params)
grads = jax.tree.map(jnp.ones_like, params)
updates, state = jax.jit(tx.update)(grads, state, params)
new = optax.apply_updates(params, updates)
w = jnp.moveaxis(new["attn"]["query"]["kernel"], 1, 0)  # (heads, d, r)
error = float(jnp.max(jnp.abs(jnp.swapaxes(w, -1, -2) @ w - jnp.eye(r))))
moved = float(jnp.max(jnp.abs(new["attn"]["query"]["kernel"] - params["attn"]["query"]["kernel"])))
assert error < 1e-5 and moved > 0, (error, moved)
print(f"stiefax {stiefax.__version__} from {here.parent}: one step, isometry error {error:.1e}")
