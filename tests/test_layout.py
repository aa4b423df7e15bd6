"""The package's shape, read from its source with ast: no import circle (function-level imports count; imports made
only for type checkers do not), no module-level registry (a dict, list or set at the top of a module that code
mutates: what a piece of the catalog would be), and the example plugins import nothing of fedl2p but its API."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fedl2p_cli"
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove", "discard",
            "__setitem__"}
CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter"}
# not registries: per-process caches of something built there, which no lookup of a piece reads
CACHES = {"fedl2p_cli.flower.simulation._CONTEXTS": "a ClientApp process's client context, built on its first message"}


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    parts = parts[len(parts) - 1 - parts[::-1].index("fedl2p_cli"):]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` except what sits under `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def declared_nodes(tree: ast.Module):
    """The statements a type checker reads at import: module level, `if TYPE_CHECKING:` blocks included, function
    bodies not."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If):
            todo.extend(node.body + node.orelse)


def import_graph(package: Path = PACKAGE, types: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports, at module level or inside functions; `types`: at module level
    and for the type checker (what makes a type-only circle)."""
    mods = {module_name(p): p for p in package.rglob("*.py")}
    graph = {}
    nodes = declared_nodes if types else runtime_nodes
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
        graph[mod] = {m for m in out if m in mods and m != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def is_container(value: ast.AST | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in CONTAINERS


def registries(path: Path) -> list[str]:
    """Module-level containers of `path` that its code mutates (item assignment, a mutating method, |=, del)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if is_container(getattr(node, "value", None)):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    mutated = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                base = t.value if isinstance(t, ast.Subscript) else t if isinstance(node, ast.AugAssign) else None
                if isinstance(base, ast.Name) and base.id in names:
                    mutated.add(base.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
              and isinstance(node.func.value, ast.Name) and node.func.value.id in names):
            mutated.add(node.func.value.id)
    return [f"{module_name(path)}.{n}" for n in sorted(mutated)]


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_type_only_import_circle():
    """Not even through `if TYPE_CHECKING:` imports: two modules that need each other's types are one module, or share
    a lower one (engine/interface.py, the methods' protocols in methods/registry.py)."""
    found = circles(import_graph(types=True))
    assert not found, "type-only import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_one(tmp_path):
    pkg = tmp_path / "fedl2p_cli"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"
                              "def g():\n    from . import a\n")
    assert circles(import_graph(pkg)) == [["fedl2p_cli.a", "fedl2p_cli.c", "fedl2p_cli.sub.b"]]
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    assert circles(import_graph(pkg)) == []  # a type checker's import is no circle at run time...
    (pkg / "sub" / "b.py").write_text("from ..c import g\n")
    assert circles(import_graph(pkg, types=True)) == [["fedl2p_cli.a", "fedl2p_cli.c", "fedl2p_cli.sub.b"]]  # ...but one


def scratch_module(tmp_path: Path, text: str) -> Path:
    """`fedl2p_cli/m.py` under tmp_path holding `text`: what a scan test feeds its scan."""
    f = tmp_path / "fedl2p_cli" / "m.py"
    f.parent.mkdir()
    f.write_text(text)
    return f


def test_no_module_level_registry():
    found = [r for p in sorted(PACKAGE.rglob("*.py")) for r in registries(p) if r not in CACHES]
    assert not found, f"module-level mutable registries: {found}"


def test_the_registry_scan_finds_one(tmp_path):
    f = scratch_module(tmp_path, "_R: dict[str, int] = {}\nTABLE = {'a': 1}\nSEEN = set()\nL = []\n"
                 "def add(k):\n    _R[k] = 1\n    SEEN.add(k)\n    x = TABLE['a']\n")
    assert registries(f) == ["fedl2p_cli.m.SEEN", "fedl2p_cli.m._R"]


def test_the_example_plugins_import_only_the_api():
    imported = {}
    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" if node.module == "fedl2p_cli" else node.module for a in node.names] \
                if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            imported |= {n: path.relative_to(ROOT) for n in names if n.split(".")[0] == "fedl2p_cli"}
    assert imported and set(imported) == {"fedl2p_cli.api"}, imported


# -- the stage list: one table (fedl2p_cli/stage_table.py) ----------------------------------------------------
TABLE = PACKAGE / "stage_table.py"


def stage_lists(path: Path, names: set[str], at_least: int = 4) -> list[str]:
    """Literal tuples, lists, sets and dicts of `path` that name `at_least` of the stages: a stage list written out
    again (a config's parents, which name two or three, are not one)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            named = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names}
            if len(named) >= at_least:
                out.append(f"{path}:{node.lineno}")
    return sorted(set(out))


def stage_names() -> set[str]:
    from fedl2p_cli.stage_table import TABLE
    return set(TABLE.names) | {s.command for s in TABLE.rows if s.command}


def test_the_stage_list_is_written_once():
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p != TABLE for hit in stage_lists(p, stage_names())]
    assert not found, f"stage lists outside fedl2p_cli/stage_table.py: {found}"


def test_the_stage_list_scan_finds_one(tmp_path):
    f = scratch_module(tmp_path, 'ORDER = ("partition", "pretrain", "stats", "meta-train")\nparents = {"partition": 1, "pretrain": 2}\n'
                 'COMMANDS = [("pfl-train", f, "x"), ("personalize", g, "y"), ("stats", h, "z"), ("analyze", i, "w")]\n')
    assert len(stage_lists(f, stage_names())) == 2



# -- stages read each other through the table ---------------------------------------------------------------------
# the stage interface and what the stages share: no stage module among them (the pipeline loads each row's module
# by the table's name for it)
STAGE_INFRA = {"__init__", "interface", "common", "harness", "pipeline", "pipeline_files", "rows"}
STORE_CALLS = {"load", "newest", "iter", "ids", "exists", "resolve", "workdir"}


def stage_module_reads(path: Path, names: set[str], own: str | None) -> list[str]:
    """Where a stage module reads another stage around the table: an import of another stage module (module level,
    in a function or for the type checker), or a store call naming another stage in a string (`store.load("stats",
    ...)`, `Store(root).newest(...)`), or a read around its inputs (`interface.reading`). What a stage reads comes
    through its inputs and the rows' readers (`inputs.get(STATS).value`, `inputs.newest(...)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            pkg = node.level == 1 or node.module in ("fedl2p_cli.stages", None)
            mods = [a.name for a in node.names] if node.module is None or node.module == "fedl2p_cli.stages" else \
                [node.module.rpartition(".")[2] if node.module.startswith("fedl2p_cli.stages.") else node.module.split(".")[0]]
            if pkg or (node.module or "").startswith("fedl2p_cli.stages."):
                found += [f"{path.stem}:{node.lineno} imports {m}" for m in mods
                          if m not in STAGE_INFRA and m != path.stem and (path.parent / f"{m}.py").is_file()]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STORE_CALLS
              and "store" in ast.unparse(node.func.value).rpartition(".")[2].lower()
              and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in names - {own}):
            found.append(f"{path.stem}:{node.lineno} {node.func.attr}({node.args[0].value!r})")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == "reading":
            found.append(f"{path.stem}:{node.lineno} reading()")  # a worker's builder too: Inputs(...).bound(...)
    return sorted(found, key=lambda hit: int(hit.split(":")[1].split()[0]))


def stage_modules() -> dict[Path, str | None]:
    """The stage modules (stages/ minus the interface and what it shares) and the stage each runs (None: a module the
    table does not name, such as analyze's beta_grid)."""
    from fedl2p_cli.stage_table import TABLE
    own = {s.module.rpartition(".")[2]: s.name for s in TABLE.rows if isinstance(s.module, str)}
    return {p: own.get(p.stem) for p in sorted((PACKAGE / "stages").glob("*.py")) if p.stem not in STAGE_INFRA}


def test_stages_read_each_other_only_through_the_table():
    """No stage module imports another, and none names another stage to the store: adding a stage that a later one
    reads is its module, its row (with its `reader`), its config and the reader's row's `parents`."""
    from fedl2p_cli.stage_table import TABLE
    names = set(TABLE.names)
    found = [hit for p, own in stage_modules().items() for hit in stage_module_reads(p, names, own)]
    assert not found, f"stage modules reading another stage around the table: {found}"


def test_what_the_stages_share_reads_no_stage():
    """The modules the stages share (the harness, the helpers, the typed rows, the pipeline) import no stage module
    and name none to the store: the harness asked `pfl` for a system's accuracy and `pretrain` for the global model's
    (issue 80). Only the interface defines `reading`, for code outside the stages."""
    from fedl2p_cli.stage_table import TABLE
    shared = sorted(STAGE_INFRA - {"interface"})
    found = [hit for m in shared for hit in stage_module_reads(PACKAGE / "stages" / f"{m}.py", set(TABLE.names), None)]
    assert not found, f"shared stage modules reading a stage: {found}"


def test_the_stage_read_scan_finds_each_kind(tmp_path):
    stages = tmp_path / "fedl2p_cli" / "stages"
    stages.mkdir(parents=True)
    for name in ("stats", "interface", "common"):
        (stages / f"{name}.py").write_text("")
    f = stages / "m.py"
    f.write_text("from . import stats as stats_stage\nfrom .interface import Inputs\nfrom .common import x\n"
                 "from fedl2p_cli.stages.stats import load\n"
                 "def g(store, inputs):\n    from .stats import read\n    store.load('pretrain', None)\n"
                 "    store.load('m', None)\n    Store(r).newest('stats', lambda a: True)\n    inputs.get('stats')\n"
                 "    inputs.newest('stats', lambda a: True)\n    reading(store, STATS, None, catalog)\n")
    assert stage_module_reads(f, {"pretrain", "stats", "m"}, "m") == [
        "m:1 imports stats", "m:4 imports stats", "m:6 imports stats", "m:7 load('pretrain')", "m:9 newest('stats')",
        "m:12 reading()"]

# -- process state: what a module keeps for the whole process besides its constants -----------------------------
# the state a module may keep, each with its reason; anything else found by `process_state` fails the test
PROCESS_STATE = {
    "fedl2p_cli.core.bn._POLICY": "the BN policy of the forward in progress: a context, set and reset around it",
    "fedl2p_cli.core.kernels._PLAIN": "torch's own kernels inside a vmapped call: a context, set and reset around it",
    "fedl2p_cli.core.autodiff._DEPTH": "how deep in nested one-client transforms a call runs: a context, set and reset around each",
    "fedl2p_cli.plugins._CURRENT": "the catalog lookups below a stage answer from: the running stage's Runtime's, "
                                   "set and reset around it (`using`), else this context's own: a context",
    "fedl2p_cli.engine.workers._CONTEXT": "a worker process's client context, set by its pool initializer",
    "fedl2p_cli.engine.workers._UPDATE": "a worker process's update function, set by its pool initializer",
    # cached module-level functions: what they return lives as long as the process (a singleton)
    "fedl2p_cli.core.mlp.template()": "shape-only module templates on the meta device: immutable, no memory",
    "fedl2p_cli.flower.fleet_routes._declared()": "the installed flwr's Fleet routes, read once in a child process: "
                                                  "an immutable frozenset of the code's answer",
}
CACHE_DECORATORS = ("cache", "lru_cache", "functools.cache", "functools.lru_cache")


def process_state(path: Path) -> list[str]:
    """Module-level state of `path` beyond constants and registries: an instance of a mutable class the module
    defines (a settings object), a ContextVar, a name functions rebind (`global`), and writes to os.environ."""
    tree = ast.parse(path.read_text())
    mod = module_name(path)
    mutable = {n.name for n in tree.body if isinstance(n, ast.ClassDef)
               and not any("frozen=True" in ast.unparse(d) for d in n.decorator_list) and not immutable_str(n)}
    found = set()
    for node in tree.body:
        value = getattr(node, "value", None)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if isinstance(value, ast.Call):
            func = ast.unparse(value.func)
            if func in mutable or func.split(".")[-1] == "ContextVar":
                found |= {f"{mod}.{t.id}" for t in targets if isinstance(t, ast.Name)}
    for node in tree.body:  # a cached module-level function: a singleton however it is spelt
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).split("(")[0] in CACHE_DECORATORS for d in node.decorator_list):
            found.add(f"{mod}.{node.name}()")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= {f"{mod}.{n}" for n in node.names}
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"
                                                  for t in node.targets):
            found.add(f"{mod}.os.environ")
    return sorted(found)


def immutable_str(node: ast.ClassDef) -> bool:
    """A str subclass with `__slots__ = ()`: no state beyond the string's own (stages/rows.py's StageKey)."""
    return any(ast.unparse(b) == "str" for b in node.bases) and any(
        isinstance(s, ast.Assign) and ast.unparse(s) == "__slots__ = ()" for s in node.body)


def test_no_new_process_state():
    found = [s for p in sorted(PACKAGE.rglob("*.py")) for s in process_state(p)]
    assert not set(found) - set(PROCESS_STATE), f"module-level process state: {sorted(set(found) - set(PROCESS_STATE))}"
    assert not set(PROCESS_STATE) - set(found), f"gone, remove from PROCESS_STATE: {set(PROCESS_STATE) - set(found)}"


def test_the_process_state_scan_finds_each_kind(tmp_path):
    f = scratch_module(tmp_path, "import os\nfrom contextvars import ContextVar\nfrom dataclasses import dataclass\n"
                 "@dataclass\nclass S:\n    x: int = 0\n@dataclass(frozen=True)\nclass F:\n    x: int = 0\n"
                 "SETTINGS = S()\nFIXED = F()\n_V = ContextVar('v')\n_C = None\n"
                 "def f():\n    global _C\n    _C = 1\n    os.environ['X'] = '1'\n"
                 "import functools\n@functools.cache\ndef one():\n    return S()\n@lru_cache(maxsize=None)\ndef two():\n    pass\n")
    assert process_state(f) == ["fedl2p_cli.m.SETTINGS", "fedl2p_cli.m._C", "fedl2p_cli.m._V", "fedl2p_cli.m.one()",
                                "fedl2p_cli.m.os.environ", "fedl2p_cli.m.two()"]


DEVICE_WORK = {"move", "to_host", "RoundCache", "client_on", "resolve"}  # fedl2p_cli.device's movers, and the decision


def device_work(path: Path) -> list[str]:
    """Where a module moves tensors itself or decides a device: a call of device.move / to_host / RoundCache /
    resolve (by attribute or imported name), a partition's client_on, a module's .cpu() / .cuda()."""
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("device")
                for a in n.names if a.name in DEVICE_WORK}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and (f.attr in ("client_on", "cpu", "cuda") or
                                             (f.attr in DEVICE_WORK and ast.unparse(f.value).endswith("device"))):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(f)}")
        elif isinstance(f, ast.Name) and f.id in imported:
            found.append(f"{path.name}:{node.lineno} {f.id}")
    return found


def test_the_default_device_scan_finds_each_kind():
    src = ("def f(a, dev: torch.device = torch.device('cpu'), *, where='cuda:0', g: 'torch.device | None' = None):\n"
           "    pass\n")
    f = ast.parse(src).body[0].args
    assert [names_a_device(d, a.annotation) for a, d in zip(f.args[1:] + f.kwonlyargs, f.defaults + f.kw_defaults)] == \
        [True, True, False]


def test_stages_never_move_tensors():
    """The executors own the device (engine/placement.py): no stage module moves a tensor or decides a device."""
    found = [w for p in sorted((PACKAGE / "stages").rglob("*.py")) for w in device_work(p)]
    assert not found, f"device work in stages/: {found}"


def test_one_place_decides_the_device():
    calls = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") for w in device_work(p)
             if w.endswith("resolve")}
    assert calls == {"runtime.py"}, calls


def test_the_device_work_scan_finds_each_kind(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from .. import device\nfrom ..device import to_host as th\n"
                 "def u(ctx, dev):\n    x = device.move(ctx.x, dev)\n    d = ctx.part.client_on(0, dev)\n"
                 "    ctx.model.cpu()\n    return th(x), device.resolve('auto'), device.RoundCache()\n")
    assert [w.split()[1] for w in device_work(f)] == ["device.move", "ctx.part.client_on", "ctx.model.cpu", "th",
                                                       "device.resolve", "device.RoundCache"]


def names_a_device(default: ast.expr, annotation: ast.expr | None) -> bool:
    """A default that is a device: torch.device(...), "cpu" / "cuda...", or any non-None value of a device-typed
    parameter (None means "where the inputs are", which is no choice)."""
    text = ast.unparse(default)
    if "torch.device(" in text or (isinstance(default, ast.Constant) and str(default.value).startswith(("cpu", "cuda"))):
        return True
    return annotation is not None and "device" in ast.unparse(annotation) and text != "None"


def test_no_default_device_in_a_signature():
    """A device is the runtime's, never a parameter's silent default."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = dict(zip([a.arg for a in node.args.args][::-1], node.args.defaults[::-1]))
                defaults |= {a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None}
                found += [f"{p.name}:{node.lineno} {a.arg}" for a in args if a.arg in defaults
                          and names_a_device(defaults[a.arg], a.annotation)]
            elif isinstance(node, ast.AnnAssign) and "device" in ast.unparse(node.annotation) and node.value is not None:
                found.append(f"{p.name}:{node.lineno} {ast.unparse(node.target)}")
    assert not found, f"default devices: {found}"


def is_alias(node: ast.stmt) -> bool:
    """A module-level type alias: `Name = <a type>` (a subscripted type, a union, NewType) or `Name: TypeAlias = ...`."""
    if isinstance(node, ast.AnnAssign):
        return ast.unparse(node.annotation).endswith("TypeAlias")
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        return False
    value = node.value
    return node.targets[0].id[:1].isupper() and not node.targets[0].id.isupper() and (
        isinstance(value, ast.Subscript) or (isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr))
        or (isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "NewType"))


def class_names(package: Path = PACKAGE) -> dict[str, list[tuple[str, bool]]]:
    """name -> [(module, whether it is a Protocol), ...] for the module-level classes and type aliases of `package`:
    both name a type, so they share one name space."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                protocol = any(ast.unparse(b).split("[")[0].endswith("Protocol") for b in node.bases)
                out.setdefault(node.name, []).append((module_name(path), protocol))
            elif is_alias(node):
                target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
                out.setdefault(ast.unparse(target), []).append((module_name(path), False))
    return out


# a Protocol of the plugin API and the one class of fedl2p's own that implements it, under the same name
IMPLEMENTS = {
    "Row": ("fedl2p_cli.protocols", "fedl2p_cli.stages.personalize"),
    "Setup": ("fedl2p_cli.protocols", "fedl2p_cli.stages.personalize"),
    "Client": ("fedl2p_cli.protocols", "fedl2p_cli.stages.harness"),
    "Trial": ("fedl2p_cli.protocols", "fedl2p_cli.stages.harness"),
    "Method": ("fedl2p_cli.protocols", "fedl2p_cli.methods.registry"),
    "System": ("fedl2p_cli.protocols", "fedl2p_cli.methods.registry"),
    "Source": ("fedl2p_cli.protocols", "fedl2p_cli.data.sources"),
}


def clashes(names: dict[str, list[tuple[str, bool]]], implements: dict[str, tuple[str, str]]) -> list[str]:
    """Names two concepts share: a class name defined twice, except a Protocol and its implementation listed in
    `implements` (name -> (the Protocol's module, the implementing class's module))."""
    out = []
    for name, defs in names.items():
        pair = implements.get(name)
        if len(defs) > 1 and not (pair and sorted(defs) == sorted([(pair[0], True), (pair[1], False)])):
            out.append(name)
    return sorted(out)


def test_one_name_per_concept():
    """A class or type-alias name names one thing: defined once, or as a Protocol of the plugin API (protocols.py's
    `Row`, `Method`, `Source`, ...) and the one class that implements it (stages/personalize.py's `Row`, ...)."""
    found = clashes(class_names(), IMPLEMENTS)
    assert not found, found


# function names several modules define for one protocol they each implement (the name means the same in each)
INTERFACES = {
    "client_of": "a round strategy's module: the client context its executor places (engine/workers.py)",
    "client_task": "a round strategy's module: one client's update from its context (engine/workers.py)",
    "client_tasks": "a round strategy's module: a group's updates as one computation (the batched executor)",
    "client_update": "an algorithm's one-client update (algorithms/fedl2p.py, algorithms/cafeme.py)",
}


def function_names(package: Path = PACKAGE) -> dict[str, set[str]]:
    """name -> the modules defining a public module-level function of that name, for compound names (a one-word verb,
    `load`, `run`, `check`, is each module's own and read qualified by it). The plugin API's wrappers (api.py) and the
    commands (cli/, named after what they run) repeat a name on purpose, so they are left out."""
    out: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        mod = module_name(path)
        if mod.endswith(".api") or ".cli." in mod:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "_" in node.name.strip("_") \
                    and not node.name.startswith("_"):
                out.setdefault(node.name, set()).add(mod)
    return out


def function_clashes(names: dict[str, set[str]], interfaces: dict[str, str]) -> list[str]:
    return sorted(n for n, mods in names.items() if len(mods) > 1 and n not in interfaces)


def test_one_meaning_per_function_name():
    """`meta_gradient` was a catalog lookup in stages/ and the computation in algorithms/: a function name that
    several modules define is one protocol they implement (INTERFACES), or it names two things."""
    found = function_clashes(function_names(), INTERFACES)
    assert not found, {n: sorted(function_names()[n]) for n in found}
    unused = set(INTERFACES) - {n for n, mods in function_names().items() if len(mods) > 1}
    assert not unused, f"defined once now, remove from INTERFACES: {unused}"


def test_the_name_clash_scan_finds_one(tmp_path):
    (tmp_path / "fedl2p_cli").mkdir()
    (tmp_path / "fedl2p_cli" / "a.py").write_text("from typing import Protocol\nclass Client(Protocol):\n    pass\n"
                                                  "class Ctx:\n    pass\nclass Executor(Protocol):\n    pass\n"
                                                  "def meta_gradient(name):\n    pass\ndef run():\n    pass\n")
    (tmp_path / "fedl2p_cli" / "b.py").write_text("class Client:\n    pass\nclass Ctx:\n    pass\n"
                                                  "Executor = Callable[[list[int]], list[int]]\nMiB = 1 << 20\n"
                                                  "def meta_gradient(model, ft):\n    pass\ndef run():\n    pass\n")
    pkg = tmp_path / "fedl2p_cli"
    assert clashes(class_names(pkg), {}) == ["Client", "Ctx", "Executor"]
    assert clashes(class_names(pkg), {"Client": ("fedl2p_cli.a", "fedl2p_cli.b")}) == ["Ctx", "Executor"]
    assert function_clashes(function_names(pkg), {}) == ["meta_gradient"]
    assert function_clashes(function_names(pkg), {"meta_gradient": "one protocol"}) == []


# the layers, lowest first: each folder and top-level module of the package (its name under fedl2p_cli/; the package's
# own __init__ is "__init__"). A module may import (at run time, inside a function, or for the type checker) from its
# own layer and those below it, never from one above. The bottom floor: core/ (the maths), errors, device, the configs,
# the plugin-facing Protocols (protocols.py), the catalog, the Runtime that carries it (with the executor interface,
# which names the Runtime) and the catalog's loader (plugins.py); the store (artifacts.py) below data/ (whose fingerprint cache
# is an artifact); engine/ below algorithms/ (the pFL systems' strategies speak the round engine's vocabulary);
# builtin.py, which registers every built-in (the Flower executor among them), and api.py, the plugin API over
# everything, near the top.
LAYERS = ("__init__", "core", "errors", "device", "configs", "protocols", "catalog", "runtime", "imports", "plugins",
          "stage_table", "tracking", "artifacts", "data", "io", "models", "methods", "engine", "algorithms", "analysis",
          "stages", "flower", "builtin", "api", "cli", "__main__")
# what the bottom floor's modules may import, by layer name (run time, inside functions and for the type checker)
FLOOR = {"fedl2p_cli.protocols": {"core", "errors", "configs"},
         "fedl2p_cli.catalog": {"protocols", "errors"}}


def layer_name(mod: str) -> str:
    return mod.split(".")[1] if mod.count(".") else "__init__"


def all_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> what it imports at run time (module level or inside a function) or for the type checker."""
    runtime, types = import_graph(package), import_graph(package, types=True)
    return {m: runtime[m] | types.get(m, set()) for m in runtime}


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """`module -> module` for every import (at run time, inside a function or for the type checker) from a layer into
    one above it."""
    def layer(mod: str) -> int | None:
        part = layer_name(mod)
        return LAYERS.index(part) if part in LAYERS else None

    out = set()
    for a, targets in all_imports(package).items():
        for b in targets:
            la, lb = layer(a), layer(b)
            if la is not None and lb is not None and lb > la:
                out.add(f"{a} -> {b}")
    return sorted(out)


def unranked(package: Path = PACKAGE) -> list[str]:
    return sorted({layer_name(module_name(p)) for p in package.rglob("*.py")} - set(LAYERS))


def floor_breaches(package: Path = PACKAGE, floor: dict[str, set[str]] = FLOOR) -> list[str]:
    """`module -> module` for every import of a bottom-floor module outside what FLOOR allows it."""
    graph = all_imports(package)
    return sorted(f"{m} -> {b}" for m, allowed in floor.items() for b in graph.get(m, ())
                  if layer_name(b) not in allowed)


def test_no_import_runs_up_the_layers():
    assert not upward_imports(), upward_imports()


def test_every_folder_and_module_is_ranked():
    assert not unranked(), f"not in LAYERS: {unranked()}"


def test_no_import_circle_through_any_import():
    """Run-time, function-level and type-only imports together: a circle that a function-level import or an
    `if TYPE_CHECKING:` block hides from one of the two checks above is still one."""
    found = circles(all_imports())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_bottom_floor_imports_nothing_above_it():
    """The plugin-facing Protocols import only core/, errors and the configs (which import only core/); the catalog
    only the Protocols and errors: neither names a layer whose pieces it holds."""
    assert not floor_breaches(), floor_breaches()


def test_the_layer_scan_finds_one(tmp_path):
    pkg = tmp_path / "fedl2p_cli"
    for folder in ("core", "engine", "stages"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "stages" / "s.py").write_text("from ..engine import e\n")
    (pkg / "engine" / "e.py").write_text("def f():\n    from ..stages import s\n")
    (pkg / "core" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import e\n")
    assert upward_imports(pkg) == ["fedl2p_cli.core.c -> fedl2p_cli.engine.e", "fedl2p_cli.engine.e -> fedl2p_cli.stages.s"]
    (pkg / "newfolder").mkdir()
    (pkg / "newfolder" / "n.py").write_text("")
    (pkg / "catalog.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .engine import e\n"
                                    "from .core import c\n")
    assert unranked(pkg) == ["newfolder"]
    assert floor_breaches(pkg, {"fedl2p_cli.catalog": {"core"}}) == ["fedl2p_cli.catalog -> fedl2p_cli.engine.e"]
    hidden = tmp_path / "hidden" / "fedl2p_cli"  # a circle each check alone misses: one arrow in a function, one typed
    hidden.mkdir(parents=True)
    (hidden / "a.py").write_text("def f():\n    from . import b\n")
    (hidden / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    assert circles(import_graph(hidden)) == circles(import_graph(hidden, types=True)) == []
    assert circles(all_imports(hidden)) == [["fedl2p_cli.a", "fedl2p_cli.b"]]


# -- the catalog is handed over: `current()` only where nothing can hand one -------------------------------------------
# each module that may look the context's catalog up, with its reason; any other call fails the test
LOOKUPS = {
    "fedl2p_cli.plugins": "defines it: `load`, which the entry points call (`of` never falls back on it)",
    "fedl2p_cli.cli.options": "the command line's edge: the command's catalog, put in its Runtime",
    "fedl2p_cli.cli.render": "the command line's edge: the pieces a command's help lists",
    "fedl2p_cli.cli.generate": "the command line's edge: the pieces the generated help lists",
    "fedl2p_cli.flower.app": "the Flower app's entry points (ClientApp, ServerApp, `flower import`): their own catalog",
    "fedl2p_cli.api": "the plugin-facing edge: `build_model` given no catalog (a plugin written before a system had "
                      "`self.catalog`) builds from the running stage's",
}


def catalog_lookups(package: Path = PACKAGE) -> dict[str, int]:
    """Calls of `current()` (`plugins.current()` or a bare `current()`), counted per module."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and ast.unparse(n.func).split(".")[-1] == "current" and not n.args]
        if calls:
            found[module_name(path)] = len(calls)
    return found


def test_the_catalog_is_looked_up_only_where_none_is_handed():
    found = catalog_lookups()
    assert not set(found) - set(LOOKUPS), f"plugins.current() below the edge (hand the catalog over): " \
                                          f"{sorted(set(found) - set(LOOKUPS))}"
    assert not set(LOOKUPS) - set(found), f"gone, remove from LOOKUPS: {sorted(set(LOOKUPS) - set(found))}"


def test_the_lookup_scan_finds_each_spelling(tmp_path):
    f = scratch_module(tmp_path, "from . import plugins\nfrom .plugins import current\n"
                                 "def f():\n    return plugins.current(), current(), plugins.current().active()\n")
    assert catalog_lookups(f.parent) == {"fedl2p_cli.m": 3}
