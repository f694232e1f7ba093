"""The ``stiefax`` command: ``stiefax <command> [options]``.

Each command lives in its own module of :mod:`stiefax.experiments` (an experiment's,
``<experiment>.command``: :mod:`stiefax.experiments.protocol`), which defines
``add_arguments(parser)`` and ``run(args) -> int``; it is imported only when used, by
its name in :data:`COMMANDS`, so ``stiefax --help`` imports no command (and neither
jax, flax nor optax). A :class:`CommandError` raised by a command prints one
line (``stiefax <command>: error: ...``) and exits with status 2, never a traceback; so
does an ``OSError`` (a full disk, an unwritable folder), and so does a missing
dependency of the ``experiments`` extra, whose line names the command that installs it.
SIGTERM is handled as Ctrl-C (exit status 128 + the signal); after either, a further one
ends the process quietly.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any
from typing import Optional
from typing import Sequence

from stiefax import __version__
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import os_error

# name -> (module, one-line help). Order is the order of `stiefax --help`.
COMMANDS = {
  "grok": ("stiefax.experiments.grok.command", "modular-arithmetic grokking (paper 4.3, 4.4)"),
  "patches": ("stiefax.experiments.patches.command", "image-patch benchmark (paper 3.3, 4.1-4.7)"),
  "lm": ("stiefax.experiments.lm.command", "decoder LM on real text: learning-rate sensitivity"),
  "report": ("stiefax.experiments.report", "tables and plots from a results directory"),
  "certify": ("stiefax.experiments.certify", "float64 certificates of the propositions"),
  "equivariance": ("stiefax.experiments.equivariance", "O(d)-equivariance table (paper Table 9)"),
  "covariance": ("stiefax.experiments.covariance", "covariance of optimizers under symmetries"),
}


#: The ``experiments`` extra of ``pyproject.toml``: its distributions by import name.
EXPERIMENTS_EXTRA = {
  "scipy": "scipy",
  "matplotlib": "matplotlib",
  "sklearn": "scikit-learn",
  "PIL": "Pillow",
  "tqdm": "tqdm",
  "orbax": "orbax-checkpoint",
}

#: What the one-line error of a command run without the ``experiments`` extra advises.
INSTALL_EXTRA = 'pip install "stiefax[experiments]"'


def _available() -> dict:
  out = {}
  for name, (module, help_) in COMMANDS.items():
    spec = importlib.util.find_spec(module)
    if spec is not None:
      out[name] = (module, help_)
  return out


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
  parser = argparse.ArgumentParser(
    prog="stiefax",
    description="Stiefel-manifold attention: experiments, reports and certificates.",
  )
  parser.add_argument(
    "--version",
    action="version",
    version=f"stiefax {__version__}",
    help="print the installed stiefax version and exit",
  )
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True
  parsers = {}
  for name, (module, help_) in _available().items():
    parsers[name] = (sub.add_parser(name, help=help_, description=help_), module)
  return parser, parsers


def missing_extra(e: ModuleNotFoundError) -> str | None:
  """The distribution of the ``experiments`` extra whose absence raised ``e``, if any."""
  return EXPERIMENTS_EXTRA.get((e.name or "").partition(".")[0])


def main(argv: Sequence[str] | None = None) -> int:
  """Runs ``stiefax argv`` (default: the program's arguments) and returns its exit status."""
  as_program = argv is None
  argv = list(sys.argv[1:] if argv is None else argv)
  parser, parsers = build_parser()
  # Only the chosen command's module is imported (and adds its arguments).
  name = next((a for a in argv if not a.startswith("-")), None)
  try:
    return _dispatch(parser, parsers, name, argv, as_program)
  except ModuleNotFoundError as e:
    dist = missing_extra(e)
    if dist is None:
      raise
    print(
      f"stiefax {name}: error: {dist} is not installed; the command needs the experiments "
      f"extra: {INSTALL_EXTRA}",
      file=sys.stderr,
    )
    return 2


def _dispatch(
  parser: argparse.ArgumentParser,
  parsers: dict,
  name: Optional[str],
  argv: list[str],
  as_program: bool,
) -> int:
  if name in parsers:
    sub_parser, module = parsers[name]
    mod = importlib.import_module(module)
    mod.add_arguments(sub_parser)
  args = parser.parse_args(argv)
  sub_parser, module = parsers[args.command]
  mod = importlib.import_module(module)
  previous = _terminate_as_interrupt()
  try:
    return int(mod.run(args) or 0)
  except CommandError as e:
    print(f"stiefax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a full disk, an unwritable folder: one line, not a traceback
    print(f"stiefax {args.command}: error: {os_error(e)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:
    signum = getattr(e, "signum", signal.SIGINT)
    if as_program:
      _quiet_exit_on_signal()
    print(f"stiefax {args.command}: interrupted", file=sys.stderr)
    return 128 + int(signum)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


class _Terminated(KeyboardInterrupt):
  """SIGTERM, raised as an interrupt so that locks are released and files closed."""

  signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: Optional[FrameType]) -> None:
  del signum, frame
  raise _Terminated


def _terminate_as_interrupt() -> Any:
  """Makes SIGTERM raise like Ctrl-C while a command runs (main thread only)."""
  if threading.current_thread() is not threading.main_thread():
    return None
  return signal.signal(signal.SIGTERM, _raise_terminated)


def _quiet_exit_on_signal() -> None:
  """After an interrupt, a further Ctrl-C or SIGTERM ends the process at once, quietly.

  The interpreter's exit (``atexit`` hooks of JAX and Orbax) would otherwise print a
  traceback for the next Ctrl-C.
  """
  if threading.current_thread() is not threading.main_thread():
    return

  def leave(signum: int, frame: Optional[FrameType]) -> None:
    del frame
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)

  signal.signal(signal.SIGINT, leave)
  signal.signal(signal.SIGTERM, leave)


if __name__ == "__main__":
  # Run through the package module so commands raise the CommandError caught above.
  sys.exit(importlib.import_module("stiefax.experiments.cli").main())
