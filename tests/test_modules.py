"""The library's module graph and its names.

No import cycles, no reaching into private names, and one home per public name: every
name is defined in exactly one module and exported from ``stiefax`` or from one
documented submodule (the modules of the API reference), never from two; a documented
submodule is a face (imports and ``__all__``) over private modules. Across the
package, the benchmarks and the examples, a standard-library submodule is imported where
it is used.
"""

import ast
import functools
import importlib
import importlib.util
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "stiefax"
# The library modules (the experiment harness and the certificates have their own rules).
LIBRARY = sorted(
  p.stem
  for p in PACKAGE.glob("*.py")
  if p.stem not in ("__init__", "certificates") and not p.stem.startswith("test")
)


@functools.cache
def _parsed(path: pathlib.Path) -> ast.Module:
  """The syntax tree of ``path``, parsed once per session (read-only: never mutate it)."""
  return ast.parse(path.read_text(encoding="utf-8"))


def _tree(name):
  return ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))


def _imports(name):
  """``{module: alias}`` of the stiefax modules that ``name`` imports, anywhere in it."""
  found = {}
  for node in ast.walk(_tree(name)):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stiefax"):
      if node.module == "stiefax":
        for a in node.names:
          found[a.name] = a.asname or a.name
      else:
        found[node.module.split(".")[1]] = None
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.startswith("stiefax."):
          found[a.name.split(".")[1]] = a.asname
  return found


def test_library_modules_form_no_import_cycle():
  graph = {m: set(_imports(m)) & set(LIBRARY) for m in LIBRARY}
  done, stack = set(), []

  def visit(m):
    if m in stack:
      pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m) :] + [m]))
    if m in done:
      return
    stack.append(m)
    for n in sorted(graph[m]):
      visit(n)
    stack.pop()
    done.add(m)

  for m in LIBRARY:
    visit(m)


def test_frames_and_layouts_are_leaf_modules():
  assert not set(_imports("_frames")), _imports("frames")
  assert set(_imports("_layout_table")) == {"_frames"}, _imports("_layout_table")
  assert set(_imports("_layouts")) == {"_frames", "_layout_table"}, _imports("_layouts")


def test_imports_are_at_module_level():
  for m in LIBRARY:
    tree = _tree(m)
    top = {id(n) for n in tree.body}
    lazy = [
      n.lineno
      for n in ast.walk(tree)
      if isinstance(n, ast.ImportFrom)
      and (n.module or "").startswith("stiefax")
      and id(n) not in top
    ]
    assert not lazy, f"stiefax/{m}.py imports stiefax modules inside functions (lines {lazy})"


@pytest.mark.parametrize("name", LIBRARY)
def test_no_module_uses_another_modules_private_names(name):
  tree = _tree(name)
  aliases = {alias or mod for mod, alias in _imports(name).items()}
  bad = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stiefax"):
      bad += [
        a.name
        for a in node.names
        if a.name.startswith("_")
        and a.name != "__version__"
        # The package's private modules (stiefax._routing, stiefax._checks) hold helpers.
        and not (node.module == "stiefax" and (PACKAGE / f"{a.name}.py").exists())
      ]
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
    ):
      bad.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
  assert not bad, f"stiefax/{name}.py uses private names of other modules: {bad}"


def test_no_module_over_500_lines():
  """Every module of the package, the experiments' included, holds at most 500 lines:
  a longer one is split along its seam."""
  lengths = {
    str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
    for p in PACKAGE.rglob("*.py")
  }
  long = {name: n for name, n in lengths.items() if n > 500}
  assert not long, f"modules over 500 lines (split them along a seam): {long}"


def test_tests_do_not_import_test_modules():
  """Shared test helpers live in helper modules (cases, kernels, harness, reference)."""
  tests = pathlib.Path(__file__).resolve().parent
  offenders = []
  for path in tests.glob("*.py"):
    for node in ast.walk(_parsed(path)):
      if isinstance(node, ast.ImportFrom) and node.module:
        mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if any(m.startswith("tests.test_") for m in mods):
          offenders.append(f"{path.name}: from {node.module} import ...")
  assert not offenders, offenders


# ----------------------------------------------------------------------------
# One home per public name.
# ----------------------------------------------------------------------------

HOOK = PACKAGE.parent / "docs" / "hooks" / "stiefax_docs.py"


def _documented_modules() -> tuple[str, ...]:
  """``API_MODULES`` of the documentation hook: the modules of the API reference."""
  for node in ast.parse(HOOK.read_text(encoding="utf-8")).body:
    if isinstance(node, ast.AnnAssign | ast.Assign):
      targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
      if any(isinstance(t, ast.Name) and t.id == "API_MODULES" for t in targets):
        return tuple(ast.literal_eval(node.value))
  raise AssertionError("API_MODULES not found in the documentation hook")


def _module_path(module: str) -> pathlib.Path:
  parts = module.split(".")[1:]
  base = PACKAGE.joinpath(*parts)
  return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _library_files() -> dict[str, pathlib.Path]:
  """``{module: path}`` of every library module (the experiment harness aside)."""
  out = {}
  for path in PACKAGE.rglob("*.py"):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    if "experiments" in rel.parts:
      continue
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    out[".".join(parts)] = path
  return out


def _dunder_all(path: pathlib.Path) -> list[str]:
  for node in _parsed(path).body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      return list(ast.literal_eval(node.value))
  return []


def _defined(path: pathlib.Path) -> set[str]:
  """The names a module defines at its top level (functions, classes, assignments)."""
  names = set()
  for node in _parsed(path).body:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      names.add(node.name)
    elif isinstance(node, ast.Assign):
      names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      names.add(node.target.id)
  return names


def _top_level(path: pathlib.Path) -> list[ast.stmt]:
  """A module's top-level statements, with those of an ``if typing.TYPE_CHECKING:``
  block (``stiefax/__init__.py`` names its exports there and loads them on first use)."""
  out: list[ast.stmt] = []
  for node in _parsed(path).body:
    out.append(node)
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      out += node.body
  return out


def _imported_from(path: pathlib.Path) -> dict[str, str]:
  """``{name: module}`` of the top-level ``from stiefax... import name`` lines."""
  out = {}
  for node in _top_level(path):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stiefax"):
      for a in node.names:
        out[a.asname or a.name] = node.module
  return out


def _is_private(module: str) -> bool:
  return any(part.startswith("_") for part in module.split("."))


def test_every_public_name_is_defined_in_exactly_one_module():
  """Defined by one public module, or by one private module that a public one exports
  it from (``stiefax._matrix.polar`` is ``stiefax.geometry.polar``)."""
  files = _library_files()
  exported = {
    name for m, p in files.items() for name in _dunder_all(p) if f"{m}.{name}" not in files
  }
  sources = {
    source
    for p in files.values()
    for name, source in _imported_from(p).items()
    if name in _dunder_all(p) and _is_private(source)
  }
  homes = {
    name: sorted(
      m for m, p in files.items() if name in _defined(p) and (not _is_private(m) or m in sources)
    )
    for name in exported
  }
  several = {name: ms for name, ms in homes.items() if len(ms) != 1}
  assert not several, f"public names defined in no module or in several: {several}"


def test_no_module_but_the_package_re_exports():
  """A module's ``__all__`` lists what it defines or takes from a private module
  (``stiefax._matrix``, ``stiefax.certificates._core``); only ``stiefax`` lists names
  of public modules, those of the undocumented ones."""
  files = _library_files()
  bad = []
  for module, path in files.items():
    defined, imported = _defined(path), _imported_from(path)
    for name in _dunder_all(path):
      if name in defined or f"{module}.{name}" in files:
        continue
      source = imported.get(name)
      if source is None:
        bad.append(f"{module}.{name}")
      elif module != "stiefax" and not _is_private(source):
        bad.append(f"{module}.{name} (from the public {source})")
  assert not bad, f"names exported by a module that does not define them: {bad}"


def test_each_public_name_is_exported_from_one_documented_module():
  documented = _documented_modules()
  files = _library_files()
  where: dict[str, list[str]] = {}
  for module in documented:
    for name in _dunder_all(_module_path(module)):
      if f"{module}.{name}" not in files and not (
        module == "stiefax" and f"stiefax.{name}" in files
      ):
        where.setdefault(name, []).append(module)
  twice = {name: ms for name, ms in where.items() if len(ms) > 1}
  assert not twice, f"names exported from several documented modules: {twice}"
  # The public names of the undocumented modules are exported from stiefax.
  top = set(_dunder_all(_module_path("stiefax")))
  missing = [
    f"{module}.{name}"
    for module, path in files.items()
    if module not in documented and not _is_private(module)
    for name in _dunder_all(path)
    if name not in top
  ]
  assert not missing, f"public names exported from no documented module: {missing}"


# The public modules of the library but the package itself: the documented submodules.
FACES = sorted(
  p for p in PACKAGE.glob("*.py") if not p.stem.startswith("_") and p.stem != "certificates"
)


def _face_problems(source: str) -> list[str]:
  """What keeps a module from being a face: a statement other than its docstring,
  ``from __future__`` imports, ``from stiefax._private import name`` lines and
  ``__all__``, or an imported name that ``__all__`` does not list (or the reverse)."""
  tree = ast.parse(source)
  problems = [] if ast.get_docstring(tree) else ["no module docstring"]
  body = tree.body[1:] if ast.get_docstring(tree) else tree.body
  imported: list[str] = []
  listed: list[str] = []
  for node in body:
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
      continue
    if isinstance(node, ast.ImportFrom) and _is_private(node.module or "") and not node.level:
      imported += [a.asname or a.name for a in node.names]
    elif isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
      listed = list(ast.literal_eval(node.value))
    else:
      problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
  if sorted(imported) != sorted(listed):
    problems.append(
      f"imports {sorted(set(imported) - set(listed))} not in __all__,"
      f" lists {sorted(set(listed) - set(imported))} not imported"
    )
  return problems


def test_the_documented_modules_are_the_faces():
  """The faces are the documented submodules (``certificates`` is a package of its own)."""
  assert {f"stiefax.{p.stem}" for p in FACES} | {"stiefax", "stiefax.certificates"} == set(
    _documented_modules()
  )


@pytest.mark.parametrize("path", FACES, ids=lambda p: p.stem)
def test_every_public_module_is_a_face(path):
  """A documented module holds no code: its docstring, the imports of its names from
  private modules and its ``__all__``. So its names are reachable from it alone
  (``stiefax.geometry.jnp`` is not), and its bodies live in a private module."""
  problems = _face_problems(path.read_text(encoding="utf-8"))
  assert not problems, f"stiefax/{path.name} is not a face: {problems}"
  module = importlib.import_module(f"stiefax.{path.stem}")
  reachable = {n for n in vars(module) if not n.startswith("__")} - {"annotations"}
  assert reachable == set(module.__all__), reachable ^ set(module.__all__)


def test_the_face_check_finds_code_and_leaks():
  ok = '"""Doc."""\nfrom __future__ import annotations\nfrom stiefax._m import a\n__all__ = ["a"]\n'
  assert _face_problems(ok) == []
  body = ok + "def f():\n  return 1\n"
  assert _face_problems(body) == ["line 5: def f():"]
  leak = ok.replace("import a", "import a, jnp")
  assert _face_problems(leak) == ["imports ['jnp'] not in __all__, lists [] not imported"]
  public = ok.replace("stiefax._m", "stiefax.geometry")
  assert _face_problems(public)[0] == "line 3: from stiefax.geometry import a"


def test_the_package_exports_what_it_imports():
  import stiefax

  for name in stiefax.__all__:
    assert hasattr(stiefax, name), name
    assert name in dir(stiefax), name


def test_dir_lists_the_public_names_only():
  import stiefax

  stiefax.stiefel_adamw  # noqa: B018 (a loaded name stays listed once)
  names = [n for n in dir(stiefax) if not n.startswith("__")]
  assert names == sorted(stiefax.__all__)
  assert not {"importlib", "typing", "annotations"} & set(dir(stiefax))
  assert "__version__" in dir(stiefax)


def test_the_packages_lazy_table_is_its_static_imports():
  """``stiefax.__getattr__`` loads exactly the names the ``TYPE_CHECKING`` block imports
  (what type checkers and the docs see), each from the same module, and ``__all__``
  lists every one of them."""
  import stiefax

  static = _imported_from(_module_path("stiefax"))
  lazy = {name: module for name, module in stiefax._EXPORTS.items()}
  lazy.update({name: "stiefax" for name in stiefax._SUBMODULES})
  assert lazy == static
  assert set(stiefax.__all__) == set(static)
  for name, module in stiefax._EXPORTS.items():
    assert getattr(stiefax, name) is getattr(importlib.import_module(module), name), name
  with pytest.raises(AttributeError, match="no attribute 'stiefel_adam'"):
    stiefax.stiefel_adam  # noqa: B018


def test_importing_the_package_loads_no_jax():
  """``import stiefax`` is light: the names, and jax with them, load on first use."""
  code = "import stiefax, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'optax', 'flax')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout


def _stdlib_package(name: str) -> bool:
  if name.partition(".")[0] not in sys.stdlib_module_names:
    return False
  try:
    spec = importlib.util.find_spec(name)
  except ImportError:  # a name inside a module (inspect.Parameter), not a module
    return False
  return spec is not None and spec.submodule_search_locations is not None


def _unimported_submodules(tree: ast.Module) -> list[str]:
  """``pkg.sub`` uses of a standard-library package's submodule that ``tree`` never
  imports (``import pkg.sub``, ``from pkg import sub``): they work only where something
  else imported it first (``importlib.util``, ``concurrent.futures``, ``xml.etree``)."""
  imported, bound = set(), {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        parts = a.name.split(".")
        imported.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        bound[a.asname or parts[0]] = a.name if a.asname else parts[0]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      imported.update(f"{node.module}.{a.name}" for a in node.names)
      bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})

  def dotted(node) -> str | None:  # the module a name or attribute chain names, if any
    if isinstance(node, ast.Name):
      return bound.get(node.id)
    if isinstance(node, ast.Attribute) and (outer := dotted(node.value)):
      return f"{outer}.{node.attr}"
    return None

  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      parent = dotted(node.value)
      used = f"{parent}.{node.attr}"
      if (
        parent
        and used not in imported
        and _stdlib_package(parent)
        and importlib.util.find_spec(used) is not None
      ):
        found.append((node.lineno, used))
  return [f"{used} (line {line})" for line, used in sorted(found)]


def test_a_standard_library_submodule_is_imported_where_it_is_used():
  root = PACKAGE.parent
  offenders = {
    str(path.relative_to(root)): bad
    for folder in ("stiefax", "benchmarks", "examples")
    for path in sorted((root / folder).rglob("*.py"))
    if (bad := _unimported_submodules(_parsed(path)))
  }
  assert not offenders, offenders


def test_the_submodule_scan_finds_an_unimported_submodule():
  tree = ast.parse(
    "import importlib\nimport xml.etree\nimportlib.util.find_spec\nxml.etree.ElementTree"
  )
  assert _unimported_submodules(tree) == [
    "importlib.util (line 3)",
    "xml.etree.ElementTree (line 4)",
  ]
  ok = "import importlib.util\nimport os\nfrom concurrent import futures\nimportlib.util.find_spec\nos.path.join\nfutures.wait"
  assert _unimported_submodules(ast.parse(ok)) == []


def test_every_type_ignore_says_why_on_its_line():
  """A ``# type: ignore[code]`` in the package carries its reason after it."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).resolve().parents[1] / "stiefax"
  bare = []
  for path in sorted(root.rglob("*.py")):
    for n, line in enumerate(path.read_text().splitlines(), 1):
      if "type: ignore" in line and not re.search(r"type: ignore\[[\w, -]+\]\s+#\s*\S", line):
        bare.append(f"{path.relative_to(root.parent)}:{n}")
  assert bare == [], bare
