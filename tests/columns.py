"""Report output as the documentation quotes it: every line within the code column.

The pages quote what ``stiefax report`` (and the other commands) print. At 1280 px a
code block holds 80 characters (tests/test_docs_layout.py), and the reports' tables
are wider, so the pages quote them through :func:`fit`: a table wider than the column
is printed in parts, each part the leading columns that tell its rows apart (most
often the first) and as many of the next columns as fit, the parts one after the other
with a blank line between them (a cell wider than the column alone is wrapped at its
spaces); a longer line outside a table is wrapped at its spaces, its continuation
indented two more spaces. No character of a cell changes, so a test can compare a page with ``fit`` of
the report that the committed runs print, line by line.
"""

from __future__ import annotations

import re
import textwrap

#: Characters a code line holds at 1280 px with both sidebars (tests/test_docs_layout.py).
WIDTH = 80

_DASHES = re.compile(r"^\s*-{3,}[- ]*$")
_ROW = re.compile(r"\S {3,}\S")  # cells apart by three spaces or more: a table's row


def _is_dashes(line: str) -> bool:
  return bool(_DASHES.match(line))


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip(" "))


def _table_end(lines: list[str], start: int) -> int:
  """The line after the table whose header is ``lines[start]`` (its rule follows):
  the rows are the lines below, up to a blank line, an indented line (a note), a
  line longer than the rule or the next table's header."""
  indent, rule = _indent(lines[start]), len(lines[start + 1].rstrip())
  end = start + 2
  while end < len(lines) and lines[end].strip() and _indent(lines[end]) <= indent:
    if len(lines[end].rstrip()) > rule:  # a note under the table, not a row
      break
    if end + 1 < len(lines) and _is_dashes(lines[end + 1]):  # the next table's header
      break
    end += 1
  return end


def _columns(table: list[str]) -> list[int]:
  """Where each column of a table begins: after every run of two or more positions
  that are blank in every line (a rule of dashes without gaps is left out)."""
  lines = [ln for ln in table if not (_is_dashes(ln) and " " not in ln.strip())]
  width = max(len(ln) for ln in lines)
  blank = [all(p >= len(ln) or ln[p] == " " for ln in lines) for p in range(width)]
  starts = [_indent(min(lines, key=_indent))]
  p = starts[0]
  while p < width:
    if blank[p]:
      q = p
      while q < width and blank[q]:
        q += 1
      if q - p >= 2 and q < width:
        starts.append(q)
      p = q
    else:
      p += 1
  return starts


def split_table(table: list[str], width: int = WIDTH) -> list[str]:
  """A table (header, rule, rows) in parts of at most ``width`` characters."""
  if max(len(ln) for ln in table) <= width:
    return list(table)
  starts = _columns(table)
  ends = starts[1:] + [max(len(ln) for ln in table)]
  if len(starts) < 3:
    return list(table)
  # The leading columns that tell the rows apart (the first, or as many as it takes),
  # with their gap: repeated in every part.
  rows = [ln for ln in table[1:] if not _is_dashes(ln)]
  key = 1
  while key < len(starts) - 2 and len({ln[: starts[key]].rstrip() for ln in rows}) < len(rows):
    key += 1
  if starts[key] > width // 2:
    key = 1
  first = starts[key]
  groups: list[list[int]] = []
  for k in range(key, len(starts)):
    if (
      groups
      and first + starts[k] - starts[groups[-1][0]] + _content(table, starts[k], ends[k]) <= width
    ):
      groups[-1].append(k)
    else:
      groups.append([k])
  out: list[str] = []
  for g, group in enumerate(groups):
    if g:
      out.append("")
    a, b = starts[group[0]], ends[group[-1]]
    for ln in table:
      if _is_dashes(ln) and " " not in ln.strip():  # a solid rule: as wide as the part
        part = ln[:first] + ln[a:b]
        out.append(part[: first + _content(table, a, b)])
      elif len(group) == 1 and first + _content(table, a, b) > width:
        out += _wrap_cell(ln[:first], ln[a:b], width)
      else:
        out.append((ln[:first] + ln[a:b]).rstrip())
  return out


def _wrap_cell(head: str, cell: str, width: int) -> list[str]:
  """A row whose one cell is wider than the part: the cell wrapped at its spaces, its
  continuation two spaces into the column (a rule is cut to the width)."""
  if _is_dashes(cell):
    return [(head + cell)[:width].rstrip()]
  return _at_spaces(cell, width, head, " " * len(head)) or [head.rstrip()]


def _at_spaces(text: str, width: int, first: str, indent: str) -> list[str]:
  """``text`` broken at spaces within ``width``: the first line after ``first``, the
  others two spaces past ``indent``; no word is ever broken."""
  return textwrap.wrap(
    text.strip(),
    width,
    initial_indent=first,
    subsequent_indent=indent + "  ",
    break_long_words=False,
    break_on_hyphens=False,
  )


def _content(table: list[str], a: int, b: int) -> int:
  """How wide the text of the columns ``a:b`` is, without the gap after them."""
  return max(len(ln[a:b].rstrip()) for ln in table if not _is_dashes(ln) or " " in ln.strip())


def wrap(line: str, width: int = WIDTH) -> list[str]:
  """A line of text within ``width``, broken at spaces, continued two spaces in."""
  if len(line) <= width or _ROW.search(line):  # a table's row: kept whole
    return [line]
  indent = " " * _indent(line)
  return _at_spaces(line, width, indent, indent)


def fit(text: str, width: int = WIDTH) -> str:
  """``text`` (a command's output) with every table and line within ``width``."""
  lines = text.splitlines()
  out: list[str] = []
  i = 0
  while i < len(lines):
    if i + 1 < len(lines) and lines[i].strip() and _is_dashes(lines[i + 1]):
      end = _table_end(lines, i)
      out += split_table(lines[i:end], width)
      i = end
    elif _ROW.search(lines[i]):  # a table without a rule: its rows share an indent
      end = i + 1
      while (
        end < len(lines) and _ROW.search(lines[end]) and _indent(lines[end]) == _indent(lines[i])
      ):
        end += 1
      out += split_table(lines[i:end], width) if end - i >= 3 else lines[i:end]
      i = end
    else:
      out += wrap(lines[i], width)
      i += 1
  return "\n".join(out)


def table_rows(text: str) -> list[list[str]]:
  """The rows of the first table in ``text`` (a command's output): the lines under its
  dashed rule up to the first blank one, each split into cells at runs of two spaces."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if _is_dashes(line)) + 1
  rows = []
  for line in lines[start:]:
    if not line.strip():
      break
    rows.append(re.split(r"\s{2,}", line.strip()))
  return rows


def paired_rows(report: str, base: str) -> dict[str, list[str]]:
  """The rows of the first "against BASE:" table of a report (its paired contrasts),
  each row's cells by its first cell ("arm - base")."""
  return {cells[0]: cells for cells in table_rows(report.split(f"against {base}:")[1])}
