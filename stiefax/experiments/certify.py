"""Float64 certificates of the paper's propositions (its Table 10).

Runs every check of :mod:`stiefax.certificates` on the shipped code and prints one
row per check: its name, the proposition, the residual of the claim, the tolerance,
the control (the same statistic where the claim must fail) and PASS/FAIL. Exits 1 if
any check fails.
"""

from __future__ import annotations

import argparse
import json
import time

from stiefax import certificates
from stiefax.experiments.cli import CommandError


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--seed", type=int, default=0, help="random draw of every check")
  parser.add_argument(
    "--only",
    action="append",
    default=None,
    metavar="CHECK",
    help="run only this check (repeatable); names as in the table",
  )
  parser.add_argument("--json", default=None, metavar="PATH", help="also write the records as JSON")


def format_table(results) -> str:
  """The certificates as a fixed-width text table."""
  header = (
    f"{'check':32s} {'proposition':12s} {'residual':>10s} {'tolerance':>10s}"
    f" {'control':>10s}  result"
  )
  lines = [header, "-" * len(header)]
  for c in results:
    lines.append(
      f"{c.name:32s} {c.proposition:12s} {c.residual:10.2e} {c.tolerance:10.0e}"
      f" {c.control:10.2e}  {'PASS' if c.passed else 'FAIL'}"
    )
  return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
  by_name = {f.__name__: f for f in certificates.CERTIFICATES}
  chosen = list(certificates.CERTIFICATES)
  if args.only:
    unknown = [n for n in args.only if n not in by_name]
    if unknown:
      raise CommandError(f"unknown check {unknown[0]!r}; valid checks are: {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.only]
  start = time.perf_counter()
  results = [cert(args.seed) for cert in chosen]
  elapsed = time.perf_counter() - start
  print(format_table(results))
  n_pass = sum(c.passed for c in results)
  print(f"\n{n_pass}/{len(results)} checks pass (float64, seed {args.seed}, {elapsed:.1f} s)")
  if args.json:
    try:
      with open(args.json, "w") as f:
        json.dump([c._asdict() for c in results], f, indent=2)
    except OSError as e:
      raise CommandError(f"cannot write --json {args.json!r}: {e.strerror}") from None
  return 0 if n_pass == len(results) else 1
