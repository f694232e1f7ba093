"""The arms of every experiment command: one registry, one entry per arm.

An arm says how the query/key frames W_Q, W_K are trained (``frames``: the frame rule
and its keyword arguments ``options``), where they start (``orthonormal``) and, for a
few arms, what they change in the rest of the model (circuit weight decay, circuit
init scale, the soft orthogonality penalty) or how the attention reads them
(``attention``: plain, QK-norm or σReparam, :mod:`stiefax.experiments.attention`).
Its entry (:class:`Arm`) is everything the commands know of it: the commands that
offer it (``commands``), its ``--help`` line (``description``), its default frame rate
(``frame_lr``), its rate grid, and the arm it changes one thing of (``base``: the
reports add the contrast arm - base, :func:`base_contrasts`). The other rates come
from the experiment's setting; :mod:`stiefax.experiments.optim` builds the optimizer.
Each command offers the arms that name it (:func:`offered`), its own arms first in
its own order. This module imports neither JAX nor Optax, so every ``--help`` lists
the arms from here.

Frame rules (``Arm.frames``):

  adamw            no separate rule: W_Q, W_K are ordinary AdamW parameters (decayed)
  adam             plain Adam on W_Q, W_K (no decay, no constraint)
  riemannian_adam  stiefax.riemannian_adam (the paper's B2 and its ablations)
  riemannian_sgd   stiefax.riemannian_sgd (PA16)
  manifold_muon    stiefax.manifold_muon
  muon             optax.contrib.muon, one matrix per head, decayed, unconstrained
  zero             optax.set_to_zero: W_Q, W_K never move

The frame rate is called ``frame_lr`` everywhere (the ``stiefel_learning_rate`` of
``stiefax.stiefel_adamw``): the frames run at ``frame_lr * lr(t) / peak``, where
``lr(t)`` is the AdamW schedule and ``peak`` its largest value.

Matrix rules (``Arm.matrices``, ``stiefax lm``): how every other hidden matrix (the
attention and MLP projections; W_Q, W_K too when ``frames`` is ``adamw``) trains;
embeddings, norm scales and other vectors stay with AdamW:

  adamw            AdamW with the rest (the default)
  adamh            stiefax.adamh: the published Hyperball over Adam, no decay
  muonh            stiefax.muonh: the published Hyperball over Muon, no decay
  muon             optax.contrib.scale_by_muon, decayed, unconstrained
  sphere_adam      stiefax.sphere.sphere_adam: the Riemannian sphere Adam, no decay
"""

from __future__ import annotations

import types
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import Mapping
from typing import Optional
from typing import Sequence

from stiefax.experiments.arm import COMMANDS
from stiefax.experiments.arm import Arm

# The fields of an entry (Arm) and their choices live in stiefax.experiments.arm.
__all__ = [
  "ARMS",
  "ALIASES",
  "offered",
  "select",
  "lookup",
  "base_contrasts",
  "Contrasts",
]


_ADAMW_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
_RADAM_GRID = (0.3, 1.0, 3.0)
_FLOAT32_EPS = 1e-8  # riemannian_adam's own eps, kept where a rule ignores the setting's
_ALL = COMMANDS
_GROK, _LM, _PATCHES = ("grok",), ("lm",), ("patches",)
_GROK_PATCHES, _LM_PATCHES = ("grok", "patches"), ("lm", "patches")

_REGISTRY: dict[str, Arm] = {
  a.name: a
  for a in (
    Arm(
      "A2",
      "AdamW + Xavier",
      "adamw",
      orthonormal=False,
      grid=_ADAMW_GRID,
      commands=_ALL,
      recorded={'grok': 'AdamW everywhere (decay on W_Q, W_K too)'},
    ),
    Arm(
      "A2-orth",
      "AdamW, orthonormal W_Q, W_K init",
      "adamw",
      grid=_ADAMW_GRID,
      commands=_PATCHES,
    ),
    Arm(
      "A2-qknorm",
      "AdamW + Xavier, QK-norm (LayerNorm on each head's q and k, learned scale)",
      "adamw",
      orthonormal=False,
      grid=_ADAMW_GRID,
      attention="qknorm",
      base="A2",
      commands=_ALL,
      recorded={'grok': "A2 with QK-norm (LayerNorm on each head's q and k)"},
    ),
    Arm(
      "A2-sigma",
      "AdamW + Xavier, sigmaReparam W_Q, W_K (gamma W / sigma(W))",
      "adamw",
      orthonormal=False,
      grid=_ADAMW_GRID,
      attention="sigma",
      base="A2",
      commands=_ALL,
      recorded={'grok': 'A2 with sigmaReparam W_Q, W_K (gamma W / sigma(W))'},
    ),
    Arm(
      "B2",
      "Riemannian Adam (Stiefel projector, scalar v)",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      commands=_ALL,
      recorded={'grok': 'Riemannian Adam on W_Q, W_K'},
    ),
    Arm(
      "B2-qknorm",
      "B2 + QK-norm (LayerNorm on each head's q and k, learned scale)",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      attention="qknorm",
      base="B2",
      commands=_ALL,
      recorded={'grok': "B2 with QK-norm (LayerNorm on each head's q and k)"},
    ),
    Arm(
      "B2-temp",
      "B2 + a learned temperature per head (exp(t_h) q·k / sqrt(r), t_h init 0)",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      temperature=True,
      commands=_LM,
    ),
    Arm(
      "B2-fold",
      "B2-temp, W_Q and W_K read x / rms(x) without the norm's gain",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      temperature=True,
      qk_input="fold",
      commands=_LM,
    ),
    Arm(
      "A2-temp",
      "AdamW + Xavier + a learned temperature per head (exp(t_h) q·k / sqrt(r))",
      "adamw",
      orthonormal=False,
      grid=_ADAMW_GRID,
      temperature=True,
      commands=_LM,
    ),
    Arm(
      "B2-diag",
      "B2 on U_h, each head U_h diag(g_h) with a learned gain g_h (init 1)",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      frame_gain=True,
      commands=_LM,
    ),
    # Study 3 (docs/lm.md): constant-norm matrices.
    Arm(
      "AdamH",
      "AdamH (Hyperball over Adam) on every hidden matrix, AdamW on the rest",
      "adamw",
      orthonormal=False,
      matrices="adamh",
      commands=_LM,
    ),
    Arm(
      "AdamH-qknorm",
      "AdamH + QK-norm (LayerNorm on each head's q and k, learned scale)",
      "adamw",
      orthonormal=False,
      attention="qknorm",
      matrices="adamh",
      commands=_LM,
    ),
    Arm(
      "Muon",
      "Muon (optax.contrib, decayed) on every hidden matrix, AdamW on the rest",
      "adamw",
      orthonormal=False,
      matrices="muon",
      commands=_LM,
    ),
    Arm(
      "MuonH",
      "MuonH (Hyperball over Muon) on every hidden matrix, AdamW on the rest",
      "adamw",
      orthonormal=False,
      matrices="muonh",
      commands=_LM,
    ),
    Arm(
      "B2-H",
      "B2 on the W_Q, W_K frames, AdamH on every other hidden matrix",
      "riemannian_adam",
      frame_lr=1.0,
      grid=_RADAM_GRID,
      matrices="adamh",
      commands=_LM,
    ),
    Arm(
      "SphereAdam",
      "Riemannian sphere Adam on every hidden matrix, AdamW on the rest",
      "adamw",
      orthonormal=False,
      matrices="sphere_adam",
      commands=_LM,
    ),
    Arm(
      "B2-SGD",
      "Riemannian SGD, Grassmann projector (PA16)",
      "riemannian_sgd",
      {"projector": "grassmann"},
      frame_lr=0.02,
      grid=(0.005, 0.02, 0.05),
      commands=_PATCHES,
    ),
    Arm(
      "frozen",
      "Riemannian arm at rate 0",
      "riemannian_adam",
      frame_lr=0.0,
      grid=(0.0,),
      commands=_LM_PATCHES,
    ),
    Arm(
      "elementwise",
      "Riemannian Adam, elementwise v",
      "riemannian_adam",
      {"moment": "elementwise"},
      frame_lr=0.03,
      grid=(0.01, 0.03, 0.1),
      commands=_PATCHES,
    ),
    Arm(
      "grassmann",
      "Riemannian Adam, Grassmann projector",
      "riemannian_adam",
      {"projector": "grassmann"},
      frame_lr=1.0,
      grid=_RADAM_GRID,
      commands=_PATCHES,
    ),
    Arm(
      "soft",
      "AdamW + lambda ||W^T W - I||_F^2",
      "adamw",
      orthonormal=False,
      grid=(0.01, 0.1, 1.0),
      penalty=True,
      commands=_PATCHES,
    ),
    Arm(
      "B2m",
      "tangent projection + elementwise Adam at the AdamW rate, no cap",
      "riemannian_adam",
      {"moment": "elementwise", "max_norm": None, "eps": _FLOAT32_EPS},
      commands=_GROK,
      recorded={'grok': 'tangent projection + elementwise Adam, no cap'},
    ),
    Arm(
      "B2m-can",
      "B2m with the canonical gradient",
      "riemannian_adam",
      {"moment": "elementwise", "max_norm": None, "eps": _FLOAT32_EPS, "projector": "canonical"},
      commands=_GROK,
    ),
    Arm(
      "B2-frz",
      "W_Q, W_K frozen at orthonormal init",
      "zero",
      commands=_GROK,
    ),
    Arm(
      "A2-nwf",
      "A2 without decay on W_Q, W_K",
      "adam",
      orthonormal=False,
      commands=_GROK,
    ),
    Arm(
      "B2-hi",
      "B2 with circuit decay 2.0",
      "riemannian_adam",
      frame_lr=1.0,
      weight_decay=2.0,
      commands=_GROK,
    ),
    Arm(
      "B2-sn",
      "B2 with circuit init 0.1x",
      "riemannian_adam",
      frame_lr=1.0,
      circuit_init_scale=0.1,
      commands=_GROK,
    ),
    Arm(
      "B2-comb",
      "B2-hi + B2-sn",
      "riemannian_adam",
      frame_lr=1.0,
      weight_decay=2.0,
      circuit_init_scale=0.1,
      commands=_GROK,
    ),
    Arm(
      "B2-mmuon",
      "manifold Muon (spectral-norm steepest descent on St)",
      "manifold_muon",
      frame_lr=0.05,
      grid=(0.02, 0.05, 0.1),
      base="B2",
      commands=_GROK_PATCHES,
      recorded={'grok': 'manifold Muon on W_Q, W_K (rate 0.05)'},
    ),
    Arm(
      "A2-muon",
      "optax.contrib.muon on W_Q, W_K, unconstrained",
      "muon",
      orthonormal=False,
      frame_lr=0.02,
      grid=(0.005, 0.02, 0.05),
      commands=_GROK_PATCHES,
      recorded={'grok': 'optax.contrib.muon on W_Q, W_K (rate 0.02), unconstrained'},
    ),
    Arm(
      "B2-qr",
      "Riemannian Adam, QR retraction",
      "riemannian_adam",
      {"retraction": "qr"},
      frame_lr=1.0,
      grid=_RADAM_GRID,
      base="B2",
      commands=_ALL,
      recorded={'grok': 'B2 with the QR retraction'},
    ),
    Arm(
      "B2-cayley",
      "Riemannian Adam, Cayley retraction",
      "riemannian_adam",
      {"retraction": "cayley"},
      frame_lr=1.0,
      grid=_RADAM_GRID,
      base="B2",
      commands=_GROK_PATCHES,
      recorded={'grok': 'B2 with the Cayley retraction'},
    ),
  )
}

#: The registry, by name (read-only; the commands read it live, so an entry added to
#: it is offered by every command its ``commands`` names).
ARMS: Mapping[str, Arm] = types.MappingProxyType(_REGISTRY)

#: Other spellings accepted on the command line (case, "-" and "_" are ignored too).
ALIASES: Mapping[str, str] = types.MappingProxyType(
  {
    "pa16": "B2-SGD",
    "b2sgd": "B2-SGD",
    "a2orth": "A2-orth",
    "soft-penalty": "soft",
    "penalty": "soft",
    "grassmann-adam": "grassmann",
    "elem": "elementwise",
    "qknorm": "A2-qknorm",
    "sigma": "A2-sigma",
    "sigmareparam": "A2-sigma",
  }
)


def select(names: Iterable[str]) -> Mapping[str, Arm]:
  """The arms ``names`` of the registry, in that order (read-only)."""
  return types.MappingProxyType({n: ARMS[n] for n in names})


class _Offered(Mapping[str, Arm]):
  """The arms of the registry that name ``command``, ``order`` first, read live."""

  def __init__(self, command: str, order: tuple[str, ...]) -> None:
    self._command, self._order = command, order

  def _names(self) -> list[str]:
    rest = [n for n in _REGISTRY if n not in self._order]
    return [n for n in (*self._order, *rest) if self._command in _REGISTRY[n].commands]

  def __getitem__(self, name: str) -> Arm:
    arm = _REGISTRY.get(name)
    if arm is None or self._command not in arm.commands:
      raise KeyError(name)
    return arm

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __len__(self) -> int:
    return len(self._names())

  def __repr__(self) -> str:
    return f"offered({self._command!r}): {', '.join(self._names())}"


def offered(command: str, order: Iterable[str] = ()) -> Mapping[str, Arm]:
  """The arms ``command`` offers: every registry entry whose ``commands`` names it, the
  names of ``order`` first (the command's own order of its help and reports), then the
  others in registry order. Read live: an entry added to the registry later is offered.
  """
  if command not in COMMANDS:
    raise ValueError(f"offered: command={command!r}; choose from {', '.join(COMMANDS)}")
  return _Offered(command, tuple(order))


def base_contrasts(
  arms: Mapping[str, Arm], listed: Iterable[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
  """The pairs ``(arm, base)`` of the arms of ``arms`` with a ``base`` it offers too,
  less the pairs of ``listed`` (a study's own contrasts), in the order of ``arms``."""
  have = set(listed)
  return tuple(
    (name, arm.base)
    for name, arm in arms.items()
    if arm.base is not None and arm.base in arms and (name, arm.base) not in have
  )


class Contrasts(Sequence):
  """A report's contrasts: a study's own list (its committed protocol), then the pair
  arm - base of every arm the command offers with a ``base`` the list lacks
  (:func:`base_contrasts`), read live from the registry.

  ``pair`` gives an entry's ``(b, a)`` (default: the entry itself); ``row`` makes the
  entry of a derived pair from ``(arm, base)`` (default: the pair); ``known`` are pairs
  the report shows elsewhere, never added.
  """

  def __init__(
    self,
    arms: Mapping[str, Arm],
    listed: Sequence,
    pair: Callable[[Any], tuple[str, str]] = tuple,
    row: Callable[[str, str], Any] = lambda b, a: (b, a),
    known: Callable[[str, str], bool] = lambda b, a: False,
  ) -> None:
    self._arms, self._listed = arms, tuple(listed)
    self._pair, self._row, self._known = pair, row, known

  def _all(self) -> tuple:
    have = [self._pair(c) for c in self._listed]
    derived = base_contrasts(self._arms, have)
    return self._listed + tuple(self._row(b, a) for b, a in derived if not self._known(b, a))

  def __getitem__(self, i: Any) -> Any:
    return self._all()[i]

  def __len__(self) -> int:
    return len(self._all())


def lookup(name: str, offered: Mapping[str, Arm]) -> Optional[Arm]:
  """The arm of ``offered`` that ``name`` spells (any case, or an alias), else None."""
  key = name.strip()
  for k, arm in offered.items():
    if k.lower() == key.lower():
      return arm
  alias = ALIASES.get(key.lower().replace("_", "-")) or ALIASES.get(
    key.lower().replace("-", "").replace("_", "")
  )
  return offered.get(alias) if alias else None
