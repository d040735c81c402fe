"""The package's shape: two floors (the library never imports the course), no import cycles, no reaches
into another module's underscore names, and `import fsdp_mini` stays light; and the library's tests
(tests/library/) import nothing from the course floor either: they train their own model (tests/small_model.py).

The checks read the source (every import statement, also those inside functions), so they see what a
reader sees. Each one is run on a small package written here with a deliberate violation, to show that it
can fail, and then on fsdp_mini itself.
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COURSE = "course"  # the course's floor, a subpackage of fsdp_mini
ENTRY_POINTS = {"__main__"}  # `python -m fsdp_mini` forwards to the course's command line; nothing imports it


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file, for every module of `package` under `root` (a package is its __init__)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of `known` modules in one file.
    `from pkg import sub` counts as an import of the module `pkg.sub` when that module exists."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            if base not in known:
                continue
            names = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.append((sub, [], node.lineno))
                else:
                    names.append(alias.name)
            if names:
                out.append((base, names, node.lineno))
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: {target for target, _, _ in imports(name, path, known) if target != name}
            for name, path in known.items()}


def is_course(name: str, package: str) -> bool:
    return name == f"{package}.{COURSE}" or name.startswith(f"{package}.{COURSE}.")


def floor_violations(root: Path, package: str) -> list[str]:
    """Library modules that import a course module."""
    graph = import_graph(root, package)
    skip = {f"{package}.{e}" for e in ENTRY_POINTS}
    return sorted(f"{src} imports {dst}" for src, targets in graph.items() if not is_course(src, package)
                  and src not in skip for dst in targets if is_course(dst, package))


def course_imports_in_tests(folder: Path, package: str) -> list[str]:
    """`file:line imports module` for each import of `package`'s course floor in the Python files of
    `folder`: import statements anywhere in a file, and in the Python scripts its strings hold (a test that
    runs a script under torchrun writes one), since either would make the library's tests need the course."""
    out = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        sources = [(tree, 0)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
                try:
                    sources.append((ast.parse(textwrap.dedent(node.value)), node.lineno - 1))
                except SyntaxError:
                    pass  # prose, not a script
        for source, offset in sources:
            for node in ast.walk(source):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    whole = is_course(node.module, package)
                    names = [node.module] if whole else [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    continue
                out += [f"{path.name}:{offset + node.lineno} imports {n}" for n in names if is_course(n, package)]
    return sorted(set(out))


def cycles(root: Path, package: str) -> list[list[str]]:
    """Every import cycle, as the list of modules around it (one per strongly connected component)."""
    graph = import_graph(root, package)
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def private_reaches(root: Path, package: str) -> list[str]:
    """`from pkg.mod import _name` and `mod_alias._name` where the underscore name is another module's."""
    known = modules(root, package)
    out = []
    for name, path in known.items():
        aliases: dict[str, str] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module in known:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in known:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for target, names, line in imports(name, path, known):
            for n in names:
                if n.startswith("_") and target != name:
                    out.append(f"{path.relative_to(root)}:{line} imports {target}.{n}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and aliases[node.value.id] != name):
                out.append(f"{path.relative_to(root)}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    return sorted(out)


def loaded_by_import(root: Path, package: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after `import package`."""
    code = f"import sys; import {package}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         timeout=120)
    return set(out.stdout.split())


HEAVY = ("matplotlib", "IPython")


def heavy_imports(root: Path, package: str) -> list[str]:
    loaded = loaded_by_import(root, package)
    return sorted(m for m in loaded if m.split(".")[0] in HEAVY or is_course(m, package))


# The two FSDP designs are siblings: neither engine's import closure reaches the other's modules.
FLAT = "fsdp.fully_sharded_data_parallel"
PER_PARAMETER = "fsdp._fully_shard.fully_shard"
FLAT_DESIGN = {FLAT, "fsdp.flat_param_handle", "fsdp.flat_param", "fsdp.plan"}
PER_PARAMETER_DESIGN = {PER_PARAMETER, "fsdp._fully_shard.fsdp_param", "fsdp._fully_shard.fsdp_param_group"}


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others (itself included)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def design_crossings(root: Path, package: str, designs: dict[str, set[str]]) -> list[str]:
    """For each design (entry module -> its modules, short names): the other designs' modules its entry
    module's import closure reaches."""
    graph = import_graph(root, package)
    out = []
    for entry, own in designs.items():
        reached = closure(graph, f"{package}.{entry}")
        for other, theirs in designs.items():
            if other != entry:
                out += [f"{entry} reaches {m}" for m in sorted(f"{package}.{t}" for t in theirs) if m in reached]
    return out


def _names_read(statement: ast.AST) -> set[str]:
    """Every name a statement reads (`x`, `obj.x`, `from m import x`, and a package's lazy export
    "module:x", see fsdp_mini/lazy_exports.py)."""
    out = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.]+:\w+", node.value):
            out.add(node.value.rsplit(":", 1)[-1])
    return out


def course_only_names(root: Path, package: str, entries: tuple[str, ...], beside: tuple[str, ...]) -> list[str]:
    """`module.name` for each public top-level name (def, class, assignment) of a module that the `entries`
    load, directly or not, which the library itself never reads: no other library module outside `beside`
    (the analysis modules) and the course, and its own module nowhere outside the name's definition. Such a
    name serves only the course or the analysis, so it belongs there, not in the engines' modules."""
    known = modules(root, package)
    graph = import_graph(root, package)
    loaded = set().union(*(closure(graph, f"{package}.{e}") for e in entries))
    readers = [m for m in known if not is_course(m, package) and m.removeprefix(f"{package}.") not in beside]
    trees = {m: ast.parse(known[m].read_text(), filename=str(known[m])) for m in known}
    read = {m: [_names_read(top) for top in trees[m].body] for m in known}  # per top-level statement
    used = {m: set().union(*read[m]) for m in readers}
    out = []
    for module in sorted(m for m in loaded - {package} if not is_course(m, package)):
        for i, node in enumerate(trees[module].body):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            elsewhere_in_module = set().union(*read[module][:i], *read[module][i + 1:])
            for name in names:
                if name.startswith("_") or name in elsewhere_in_module:
                    continue
                if not any(name in used[m] for m in readers if m != module):
                    out.append(f"{module.removeprefix(package + '.')}.{name}")
    return sorted(out)


def stated_layers(root: Path, package: str) -> dict[str, int]:
    """The layer of each top-level module or subpackage, as the package's docstring numbers them
    ("  1. one process: a (...), b, ..."; a name's parenthesised note is skipped)."""
    doc = ast.get_docstring(ast.parse((root / package / "__init__.py").read_text())) or ""
    layers, current = {}, None
    for line in doc.splitlines():
        numbered = re.match(r"\s+(\d+)\. ", line)
        if numbered:
            current = int(numbered.group(1))
        elif not line.startswith("     "):
            current = None
        if current is None:
            continue
        text = re.sub(r"\([^()]*(?:\([^()]*\)[^()]*)*\)", "", line)  # notes, one level of nesting inside
        for word in re.findall(r"(?<![\w.`])([a-z_]+)(?=/|\b)", text):
            if (root / package / f"{word}.py").exists() or (root / package / word / "__init__.py").exists():
                layers.setdefault(word, current)
    return layers


def layer_violations(root: Path, package: str) -> list[str]:
    """Imports that go up the stated layers: a module importing one of a later layer (within one top-level
    name, a package's modules among themselves, there is no order to check)."""
    layers = stated_layers(root, package)
    graph = import_graph(root, package)

    def top(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    out = []
    for src, targets in graph.items():
        if is_course(src, package) or top(src) in ("", *ENTRY_POINTS):
            continue
        for dst in targets:
            if is_course(dst, package) or top(dst) in ("", top(src)):
                continue
            if layers.get(top(src), 0) < layers.get(top(dst), 0):
                out.append(f"{src} (layer {layers.get(top(src))}) imports {dst} (layer {layers.get(top(dst))})")
    return sorted(out)


# --- a package with one violation of each kind: every check must find its own ----------------------

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def bad_package(tmp_path) -> Path:
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg import engine\n",
        "pkg/engine.py": """
            from pkg import helpers as H
            from pkg.state import _secret

            def run():
                from pkg.course import plots  # a library module reaching up to the course
                return H._internal(), _secret
            """,
        "pkg/helpers.py": "def _internal():\n    return 1\n",
        "pkg/state.py": "_secret = 2\nfrom pkg import cyc_a\n",
        "pkg/cyc_a.py": "from pkg import cyc_b\n",
        "pkg/cyc_b.py": "import pkg.cyc_a\n",
        "pkg/course/__init__.py": "",
        "pkg/course/plots.py": "import matplotlib\nfrom pkg import helpers\n",
    })
    return tmp_path


def test_the_layer_check_finds_an_import_up_the_layers(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": '"""The package.\nBottom up:\n  1. low (the bottom), other\n  2. high (imports low: allowed)\n"""\n',
        "pkg/low.py": "from pkg import high\n",  # up: layer 1 importing layer 2
        "pkg/other.py": "",
        "pkg/high.py": "from pkg import low, other\n",
    })
    assert stated_layers(tmp_path, "pkg") == {"low": 1, "other": 1, "high": 2}
    assert layer_violations(tmp_path, "pkg") == ["pkg.low (layer 1) imports pkg.high (layer 2)"]


def test_the_checks_find_deliberate_violations(bad_package):
    assert floor_violations(bad_package, "pkg") == ["pkg.engine imports pkg.course.plots"]
    assert cycles(bad_package, "pkg") == [["pkg.cyc_a", "pkg.cyc_b"]]
    assert private_reaches(bad_package, "pkg") == ["pkg/engine.py:3 imports pkg.state._secret",
                                                   "pkg/engine.py:7 reads pkg.helpers._internal"]


def test_the_test_check_finds_course_imports_in_statements_and_in_scripts(tmp_path):
    _write(tmp_path, {
        "test_a.py": "import torch\nfrom pkg import course\nfrom pkg.engine import run\n",
        "test_b.py": '''
            SCRIPT = """
            import sys
            from pkg.course.models import Model
            """
            NOTE = "a sentence that says import but is no script"

            def test_it():
                import pkg.course.plots as P
            ''',
        "helpers.py": "from pkg import helpers\n",
    })
    assert course_imports_in_tests(tmp_path, "pkg") == ["test_a.py:2 imports pkg.course",
                                                        "test_b.py:4 imports pkg.course.models",
                                                        "test_b.py:9 imports pkg.course.plots"]


def test_the_design_check_finds_a_design_reaching_the_other(bad_package):
    _write(bad_package, {"pkg/flat.py": "from pkg import dispatch\n", "pkg/dispatch.py": "import pkg.per_param\n",
                         "pkg/per_param.py": "from pkg import helpers\n"})
    designs = {"flat": {"flat"}, "per_param": {"per_param"}}
    assert design_crossings(bad_package, "pkg", designs) == ["flat reaches pkg.per_param"]
    (bad_package / "pkg/flat.py").write_text("from pkg import helpers\n")
    assert design_crossings(bad_package, "pkg", designs) == []


def test_the_course_only_check_finds_a_helper_only_the_course_reads(bad_package):
    _write(bad_package, {"pkg/__init__.py": "from pkg import engine\nfrom pkg.engine import run\n",
                         "pkg/helpers.py": """
        def _internal():
            return used_here()

        def used_here():
            return 1

        def for_the_plots():
            return 2

        def for_the_estimate():
            return 3
        """,
        "pkg/estimate.py": "from pkg.helpers import for_the_estimate\n",
        "pkg/course/plots.py": "from pkg.helpers import for_the_plots\n"})
    assert course_only_names(bad_package, "pkg", ("engine",), beside=("estimate",)) == [
        "helpers.for_the_estimate", "helpers.for_the_plots"]
    (bad_package / "pkg/state.py").write_text("from pkg import cyc_a\nfrom pkg.helpers import for_the_plots\n")
    assert course_only_names(bad_package, "pkg", ("engine",), beside=("estimate",)) == ["helpers.for_the_estimate"]


def test_the_light_import_check_sees_a_heavy_import(bad_package):
    (bad_package / "pkg/__init__.py").write_text("from pkg.course import plots\n")
    pytest.importorskip("matplotlib")
    assert {"matplotlib", "pkg.course.plots"} <= set(heavy_imports(bad_package, "pkg"))


# --- fsdp_mini itself ---------------------------------------------------------------------------------

def test_the_library_never_imports_the_course():
    assert floor_violations(ROOT, "fsdp_mini") == []


def test_the_library_tests_never_import_the_course():
    assert course_imports_in_tests(ROOT / "tests" / "library", "fsdp_mini") == []


def test_no_import_cycles():
    assert cycles(ROOT, "fsdp_mini") == []


def test_no_module_reaches_into_another_modules_private_names():
    assert private_reaches(ROOT, "fsdp_mini") == []


def test_the_two_fsdp_designs_do_not_import_each_other():
    # the flat design (FSDP1's) and the per-parameter one (FSDP2's) share only the common mechanics
    # (collectives, states, gathered_storage, grad_reduction, full_state, ...), never a design module
    designs = {FLAT: FLAT_DESIGN, PER_PARAMETER: PER_PARAMETER_DESIGN}
    assert design_crossings(ROOT, "fsdp_mini", designs) == []
    graph = import_graph(ROOT, "fsdp_mini")
    shared = closure(graph, f"fsdp_mini.{FLAT}") & closure(graph, f"fsdp_mini.{PER_PARAMETER}")
    assert not {f"fsdp_mini.{m}" for m in FLAT_DESIGN | PER_PARAMETER_DESIGN} & shared


def test_import_fsdp_mini_loads_neither_matplotlib_nor_ipython_nor_the_course():
    assert heavy_imports(ROOT, "fsdp_mini") == []


def test_both_floors_exist_and_the_entry_point_only_forwards():
    names = modules(ROOT, "fsdp_mini")
    library = [n for n in names if not is_course(n, "fsdp_mini")]
    course = [n for n in names if is_course(n, "fsdp_mini")]
    assert {f"fsdp_mini.{FLAT}", f"fsdp_mini.{PER_PARAMETER}", "fsdp_mini.runtime", "fsdp_mini.run"} <= set(library)
    assert {f"fsdp_mini.{COURSE}.{m}" for m in ("cli", "viz", "bench")} <= set(course)
    graph = import_graph(ROOT, "fsdp_mini")
    assert graph["fsdp_mini.__main__"] == {f"fsdp_mini.{COURSE}.cli"}
    assert not any("fsdp_mini.__main__" in targets for targets in graph.values())


@pytest.mark.parametrize("readme", ["README.md", "README.ru.md"])
def test_the_readmes_list_every_module_of_both_floors(readme):
    text = (ROOT / readme).read_text()
    missing = []
    for name in modules(ROOT, "fsdp_mini"):
        if name == "fsdp_mini":
            continue
        short = name.removeprefix(f"fsdp_mini.{COURSE}.") if is_course(name, "fsdp_mini") else name.removeprefix("fsdp_mini.")
        if name != f"fsdp_mini.{COURSE}" and f"`{short}`" not in text:
            missing.append(short)
    assert missing == []


def test_no_module_imports_one_of_a_later_layer():
    """fsdp_mini/__init__.py's numbered layers hold every top-level module and package, and each imports
    only from its own layer or the ones before it."""
    layers = stated_layers(ROOT, "fsdp_mini")
    top = {p.stem for p in (ROOT / "fsdp_mini").glob("*.py") if not p.stem.startswith("__")}
    top |= {p.name for p in (ROOT / "fsdp_mini").iterdir() if (p / "__init__.py").exists() and p.name != COURSE}
    assert sorted(top - set(layers)) == []
    assert layer_violations(ROOT, "fsdp_mini") == []


def test_the_layer_docstrings_name_every_library_module():
    """fsdp_mini/__init__.py's docstring is the library's map: every module and package at the top is on it,
    and each package's own docstring names every module in it."""
    top = ROOT / "fsdp_mini"
    missing = []
    for folder in [top] + [p for p in top.rglob("*") if p.is_dir() and (p / "__init__.py").exists()
                           and COURSE not in p.relative_to(top).parts]:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        names = [p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")]
        names += [p.name for p in folder.iterdir() if (p / "__init__.py").exists() and p.name != COURSE]
        missing += [f"{folder.relative_to(ROOT)}: {n}" for n in sorted(names) if not re.search(rf"\b{n}\b", doc)]
    assert not missing, f"modules missing from their package's docstring: {missing}"


# The library's analysis modules: beside the engines, never imported by them (fsdp_mini/__init__.py's map)
ANALYSIS = ("estimates", "saved_activations", "fsdp.strategy_facts")


# Public names of the modules the engines load that no library module reads: tools for the user, each
# for its reason. Any other name there that only the course or an analysis module reads belongs with them.
USER_TOOLS = {
    f"{FLAT}.materialise_by_name": "a param_init_fn for a model whose initial values are a function of the name",
    f"{PER_PARAMETER}.memory_stats": "this rank's bytes under fully_shard, as FSDP.memory_stats reports them",
}


def test_the_engines_modules_hold_nothing_that_only_the_course_or_the_analysis_reads():
    """Teaching baselines, the lessons' helpers and the analysis' facts live on the course floor or in an
    analysis module (ANALYSIS), not in a module the two designs load."""
    found = course_only_names(ROOT, "fsdp_mini", (FLAT, PER_PARAMETER), beside=ANALYSIS)
    assert sorted(set(found) - set(USER_TOOLS)) == []
    assert set(USER_TOOLS) <= set(found), "a user tool the library now reads itself: drop it from USER_TOOLS"


# What `import fsdp_mini.fsdp` (the core: both designs) must not load: the analysis, the diagnostics (they
# subscribe to the collectives' calls, fsdp_mini/collective_calls.py), the other packages, the launcher,
# the course.
NOT_CORE = tuple(f"fsdp_mini.{m}" for m in ANALYSIS) + (
    "fsdp_mini.flight_recorder", "fsdp_mini.comm_log", "fsdp_mini.run", "fsdp_mini.runtime", "fsdp_mini.byte_format", "fsdp_mini.checkpoint", "fsdp_mini.tensor", "fsdp_mini.optim", "fsdp_mini._composable",
    "fsdp_mini.parallel.ddp", "fsdp_mini.memory_ledger", f"fsdp_mini.{COURSE}")


@functools.lru_cache(maxsize=None)
def loaded_by_core(root: Path, package: str) -> tuple[str, ...]:
    """The modules of `package` that a fresh `import package.fsdp` loads (one interpreter for every check)."""
    code = f"import sys, {package}.fsdp; print(' '.join(m for m in sys.modules if m.split('.')[0] == {package!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    return tuple(sorted(out.stdout.split()))


def core_loads(root: Path, package: str, forbidden: tuple[str, ...]) -> list[str]:
    """The modules of `forbidden` (or below them) that a fresh `import package.fsdp` loads."""
    return [m for m in loaded_by_core(root, package) if any(m == f or m.startswith(f + ".") for f in forbidden)]


def test_the_core_check_sees_a_module_it_must_not_load():
    assert core_loads(ROOT, "fsdp_mini", ("fsdp_mini.fsdp.plan",)) == ["fsdp_mini.fsdp.plan"]


def test_import_fsdp_mini_fsdp_loads_the_core_alone():
    """`import fsdp_mini.fsdp` loads both designs and their shared mechanics, and neither the analysis, the
    flight recorder, CommLog, checkpointing, launching, TP, ZeRO, DDP, the ledger, nor anything of the course."""
    assert core_loads(ROOT, "fsdp_mini", NOT_CORE) == []


def test_both_designs_units_live_one_lifecycle():
    """Issue 44: a unit's life in a step is `UnitLifecycle`'s in both designs; the module hooks (`FSDP`,
    `FSDPState`) only pick units and call them, never gathering or freeing a unit themselves."""
    from fsdp_mini.fsdp._fully_shard.fsdp_param_group import FSDPParamGroup
    from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPState
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP, FSDPUnit
    from fsdp_mini.fsdp.units import UnitLifecycle
    for unit in (FSDPUnit, FSDPParamGroup):
        assert issubclass(unit, UnitLifecycle)
        assert unit.pre_forward is UnitLifecycle.pre_forward  # the gather-prefetch-wait of forward: one copy
    for router, hooks in ((FSDP, ("_pre_forward", "_post_forward", "_pre_backward")),
                          (FSDPState, ("pre_forward", "post_forward", "_pre_backward"))):
        for name in hooks:
            source = textwrap.dedent(inspect.getsource(getattr(router, name)))
            calls = {node.func.attr for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
            assert not calls & {"unshard", "wait_for_unshard"}, f"{router.__name__}.{name} gathers a unit itself"


def reading_list(text: str) -> list[str]:
    """The modules the README's core reading list names: the numbered items after "loads:" up to the
    next blank line after them, short names as the tables write them."""
    start = text.index("`import fsdp_mini.fsdp`", text.index("## "))
    block = text[start:text.index("\n\n", text.index("\n1. ", start))]
    return re.findall(r"`([a-z_][\w.]*)`", block[block.index("\n1. "):])


def core_figures(root: Path, package: str) -> tuple[int, int, int]:
    """(modules, lines, lines of code) of the core closure's modules, packages' __init__ files left out."""
    known = modules(root, package)
    files = [known[m] for m in loaded_by_core(root, package) if known[m].name != "__init__.py"]
    lines = code = 0
    for f in files:
        source = f.read_text()
        lines += len(source.splitlines())
        docs = {n.body[0].lineno + i for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
                for i in range(n.body[0].end_lineno - n.body[0].lineno + 1)}
        code += sum(1 for i, line in enumerate(source.splitlines(), 1)
                    if line.strip() and not line.strip().startswith("#") and i not in docs)
    return len(files), lines, code


@pytest.mark.parametrize("readme", ["README.md", "README.ru.md"])
def test_the_readme_reading_list_is_the_core_closure(readme):
    """Issue 44: the reading list names exactly the modules `import fsdp_mini.fsdp` loads, once each, and
    its figures (modules, lines, lines of code) are the closure's, within 5 % for the rounded ones."""
    text = (ROOT / readme).read_text()
    listed = reading_list(text)
    core = {m.removeprefix("fsdp_mini.") for m in loaded_by_core(ROOT, "fsdp_mini")
            if modules(ROOT, "fsdp_mini")[m].name != "__init__.py"}
    assert sorted(listed) == sorted(core) and len(listed) == len(set(listed))
    count, lines, code = core_figures(ROOT, "fsdp_mini")
    stated = re.search(r"(\d+) (?:modules|модулей), (?:about|около) ([\d,\u202f]+)\s+(?:lines|строк)\s+"
                       r"\((?:about|из\s+них\s+около)\s+([\d,\u202f]+)", text)
    number = lambda s: int(re.sub(r"[,\u202f]", "", s))
    assert int(stated[1]) == count
    assert abs(number(stated[2]) - lines) <= 0.05 * lines and abs(number(stated[3]) - code) <= 0.05 * code


def test_the_reading_list_parser_reads_the_numbered_items():
    text = "## What\n`import fsdp_mini.fsdp` loads:\n\n1. the collectives: `collectives`;\n2. `fsdp.plan`.\n\nnext"
    assert reading_list(text) == ["collectives", "fsdp.plan"]
