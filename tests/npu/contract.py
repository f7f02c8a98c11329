"""Reading published torch_npu (and torch) source with ast, never importing it.

`our_usage()` lists what FastaNPUAutotuner (with the shared mixin) overrides
on, reads from and calls on its base classes; `BaseChain` answers whether the
published base classes provide each of those with a compatible signature.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NPU_HEURISTICS = "torch_npu/_inductor/runtime/triton_heuristics.py"
NPU_FASTA = "torch_npu/_inductor/runtime/fasta_autotune.py"
NPU_CONFIG = "torch_npu/_inductor/config.py"
NPU_CODEGEN = "torch_npu/_inductor/codegen/triton.py"
NPU_COMBO = "torch_npu/_inductor/codegen/triton_combo_kernel.py"
TORCH_HEURISTICS = "torch/_inductor/runtime/triton_heuristics.py"


def cache_dir() -> Path:
    path = Path(os.environ.get("FASTA_SM_TEST_CACHE", Path.home() / ".cache" / "fasta-sm" / "test-wheels"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def download_wheel(package: str, version: str) -> tuple[Path | None, str]:
    """A cached published wheel (x86_64, cp311: the Python source is the same on every platform)."""
    target = cache_dir() / f"{package}-{version}"
    found = sorted(target.glob("*.whl")) if target.exists() else []
    if found:
        return found[0], ""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
           "--platform", "manylinux_2_28_x86_64", "-d", str(target), f"{package}=={version}"]
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return None, f"pip download {package}=={version} timed out"
    found = sorted(target.glob("*.whl"))
    if done.returncode != 0 or not found:
        return None, f"pip download {package}=={version} failed: {(done.stderr or done.stdout).strip()[-400:]}"
    return found[0], ""


def read_from_wheel(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode()


@dataclass
class Method:
    name: str
    args: ast.arguments

    def accepts_keyword(self, keyword: str) -> bool:
        return self.names(keyword) or self.args.kwarg is not None

    def names(self, keyword: str) -> bool:
        """Whether `keyword` is a parameter of its own, not only swallowed by `**kwargs` (and perhaps ignored)."""
        a = self.args
        return keyword in [p.arg for p in a.posonlyargs[1:] + a.args[1:] + a.kwonlyargs]

    def params(self) -> list[tuple[str, str, bool]]:
        """(name, kind, required) for every parameter but self."""
        a = self.args
        out = []
        positional = a.posonlyargs + a.args
        first_default = len(positional) - len(a.defaults)
        for i, p in enumerate(positional):
            if i == 0:
                continue
            out.append((p.arg, "positional", i < first_default))
        if a.vararg:
            out.append((a.vararg.arg, "varargs", False))
        for p, default in zip(a.kwonlyargs, a.kw_defaults):
            out.append((p.arg, "keyword", default is None))
        if a.kwarg:
            out.append((a.kwarg.arg, "varkw", False))
        return out


@dataclass
class ClassInfo:
    name: str
    methods: dict[str, Method] = field(default_factory=dict)
    attributes: set[str] = field(default_factory=set)


def class_info(source: str, class_name: str) -> ClassInfo:
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if node is None:
        raise LookupError(f"class {class_name} not found")
    info = ClassInfo(class_name)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            info.methods[item.name] = Method(item.name, item.args)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            info.attributes |= {t.id for t in targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):
        targets = []
        if isinstance(sub, ast.Assign):
            targets = sub.targets
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    info.attributes.add(t.attr)
    return info


class BaseChain:
    """NPUCachingAutotuner (torch_npu) → CachingAutotuner (torch), most derived first."""

    def __init__(self, classes: list[ClassInfo]):
        self.classes = classes

    def method(self, name: str) -> Method | None:
        for info in self.classes:
            if name in info.methods:
                return info.methods[name]
        return None

    def has(self, name: str) -> bool:
        return any(name in c.methods or name in c.attributes for c in self.classes)


@dataclass
class Usage:
    overrides: dict[str, Method]
    reads: set[str]
    writes: set[str]
    calls: list[tuple[str, list[str], bool]]  # (name, keywords, via super())


def our_usage() -> Usage:
    """What FastaNPUAutotuner and FastaAutotunerMixin define, read and call on `self` / `super()`."""
    ours = [
        (ROOT / "fasta_sm/npu/autotuner.py", "FastaNPUAutotuner"),
        (ROOT / "fasta_sm/driver.py", "FastaAutotunerMixin"),
    ]
    defined: dict[str, Method] = {}
    own_attrs: set[str] = set()
    reads: set[str] = set()
    writes: set[str] = set()
    calls: list[tuple[str, list[str], bool]] = []
    for path, name in ours:
        source = path.read_text()
        info = class_info(source, name)
        for method_name, method in info.methods.items():
            defined.setdefault(method_name, method)
        own_attrs |= {a for a in info.attributes if a.startswith("_fasta")} | {
            a for a in info.attributes if a in info.methods}
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
        own_attrs |= {t.id for item in node.body if isinstance(item, (ast.Assign, ast.AnnAssign))
                      for t in (item.targets if isinstance(item, ast.Assign) else [item.target])
                      if isinstance(t, ast.Name)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                (reads if isinstance(sub.ctx, ast.Load) else writes).add(sub.attr)
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                target = sub.func.value
                keywords = [k.arg for k in sub.keywords if k.arg]
                if isinstance(target, ast.Name) and target.id == "self":
                    calls.append((sub.func.attr, keywords, False))
                elif isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
                    calls.append((sub.func.attr, keywords, True))
    every_object = {"__class__", "__dict__"}  # Python's own, on every instance: not torch_npu's members
    reads -= set(defined) | own_attrs | every_object
    writes -= set(defined) | {a for a in own_attrs if a.startswith("_fasta")} | every_object
    return Usage(overrides=defined, reads=reads, writes=writes, calls=calls)


def incompatible(ours: Method, base: Method) -> list[str]:
    """Why `ours` cannot stand in for `base` wherever the base is called (empty when it can)."""
    problems = []
    mine = {name: (kind, required) for name, kind, required in ours.params()}
    has_varargs = any(kind == "varargs" for kind, _ in mine.values())
    has_varkw = any(kind == "varkw" for kind, _ in mine.values())
    base_names = {name for name, _, _ in base.params()}
    for name, kind, _ in base.params():
        if kind == "positional" and name not in mine and not (has_varargs and has_varkw):
            problems.append(f"base parameter {name!r} (positional) is not accepted")
        if kind == "keyword" and name not in mine and not has_varkw:
            problems.append(f"base keyword {name!r} is not accepted")
        if kind == "varargs" and not has_varargs:
            problems.append("base takes *args; the override does not")
        if kind == "varkw" and not has_varkw:
            problems.append("base takes **kwargs; the override does not")
    for name, (_kind, required) in mine.items():
        if required and name not in base_names:
            problems.append(f"override requires {name!r}, which base callers do not pass")
    return problems
