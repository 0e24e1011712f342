"""Check offline that what `sam build` ships is what the lock pins and the tests run.

Usage: .venv/bin/python tools/check_artifacts.py [--root DIR] [--arch x86_64|arm64 ...]
(run by `make lint`; `--help` for the options). It needs PyPI (package metadata and the layer's wheels,
cached by uv), never Docker, AWS or python3.12. Each failure is one line `FAIL ...`; exit status 0 =
every check passed, 1 = a check failed, 2 = the template or a requirements file cannot be read,
3 = uv failed for another reason (no network, ...).

For every layer (AWS::Serverless::LayerVersion) and zip function of template.yaml whose ContentUri or
CodeUri holds a requirements.txt, that is, what `sam build` pip-installs, and for each architecture:
  * every line is pinned `name==version` with `--hash`es, at the lock's version (requirements/lock.txt,
    plus requirements/model-data.txt, the lock of the data-only wheels), markers evaluated for Lambda;
  * it installs from binary wheels only for CPython 3.12 on manylinux_2_34 or older (x86_64, aarch64:
    the same tags aws-lambda-builders accepts for python3.12), in hash-checking mode, so a dependency
    that is not pinned and hashed fails too;
  * each zip function's CodeUri plus its layers, unzipped, is at most Lambda's 262,144,000 bytes
    ("250 MB"), counted without bytecode as sam build packages it;
  * every third-party module the function's code and layers import at module level is shipped by one
    of those wheels (boto3 included: Lambda's own copy would be a version no test ran).
For every image function (PackageType Image), from its Metadata (Dockerfile, DockerContext,
DockerBuildArgs) and ImageConfig.Command:
  * every base image has a version tag; every COPY source exists in the build context;
  * every `pip install` installs only hashed requirement files with --require-hashes, pinned to the
    lock; for each architecture they resolve with no package left unpinned, from wheels except
    BUILT_FROM_SOURCE; the modules its code imports at module level are in them;
  * the handler named by ImageConfig.Command is copied into the image's task root.
Every function's handler (zip and image) is then imported in a fresh interpreter with only the code in
the layout it ships in (CodeUri and layer folders, or the image's copies) on sys.path, and this venv's
site-packages for the third-party packages (the host's Python, not 3.12: the wheels above are checked
for shipping, these imports for the code). Last, every package installed in this venv must be the
lock's version: the tests run what ships.

Why a script of our own: no tool checks a SAM application's artifacts without building them. `sam build`
needs Docker for the images and a local python3.12, checks neither versions against a lock nor the
250 MB limit (the deploy fails), and verifies hashes only for the host platform (lambda-builders fetches
the target platform's wheels again without them). hadolint (`make lint` runs it too) lints Dockerfile
style, not build contexts, handlers or requirement files. The work itself is done by libraries: uv
(resolution and wheels), packaging (requirements, markers), dockerfile-parse, and the local stack's
template loader (cfn-lint's decoder, the SAM translator's Globals).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from batchinfer_local.template import TemplateError, load_template, merge_function_globals

ROOT = Path(__file__).resolve().parents[1]
# Lambda quotas: a function's deployment package and all its layers, unzipped, at most 250 MB (MiB).
UNZIPPED_LIMIT_BYTES = 262_144_000
# Template Architecture -> platform_machine. python3.12 runs on Amazon Linux 2023 (glibc 2.34):
# aws-lambda-builders accepts manylinux1 .. manylinux_2_34 wheels for it, as does this platform.
MACHINES = {"x86_64": "x86_64", "arm64": "aarch64"}
GLIBC = "manylinux_2_34"
LAMBDA_PYTHON = "3.12"
# PyPI has only an sdist of these; the image's build stage compiles them.
BUILT_FROM_SOURCE = {"llama-cpp-python"}
TASK_ROOT = "/var/task"  # LAMBDA_TASK_ROOT of the AWS base images
NOT_SHIPPED = ("__pycache__", ".pyc")  # sam build leaves bytecode out
PIP_OPTIONS_WITH_VALUE = {
    "-t",
    "--target",
    "-c",
    "--constraint",
    "-i",
    "--index-url",
    "--extra-index-url",
    "--platform",
    "--python-version",
    "--implementation",
    "--abi",
    "--prefix",
    "--root",
}


class InputError(Exception):
    """The template, a Dockerfile or a requirements file cannot be read."""


class InstallerError(Exception):
    """uv failed for a reason that is not a finding (network, ...)."""


@dataclass
class Pin:
    """One requirement line: `name[extras]==version ; marker --hash=...` (name canonical)."""

    name: str
    version: str | None
    spec: str
    marker: Marker | None
    hashed: bool
    where: str


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        if message not in self.failures:  # the same finding for each architecture is one finding
            self.failures.append(message)
            print(f"FAIL {message}", flush=True)


def rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def read_requirements(path: Path, root: Path) -> list[Pin]:
    """The requirement lines of a pip requirements file (continuations joined, comments dropped)."""
    if not path.is_file():
        raise InputError(f"no requirements file {path}")
    pins, logical, start = [], "", 0
    for number, line in enumerate([*path.read_text().splitlines(), ""], 1):
        line = re.sub(r"(^|\s)#.*", "", line).rstrip()
        start = start if logical else number
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical, text = "", (logical + line).strip()
        if not text:
            continue
        where = f"{rel(path, root)}:{start}"
        spec = re.sub(r"\s--hash[=\s]\S+", "", " " + text).strip()
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            raise InputError(f"{where}: {spec!r} is not a requirement ({exc})") from exc
        specifiers = list(req.specifier)
        pinned = (
            not req.url
            and len(specifiers) == 1
            and specifiers[0].operator == "=="
            and "*" not in str(specifiers[0])
        )
        pins.append(
            Pin(
                canonicalize_name(req.name),
                specifiers[0].version if pinned else None,
                spec,
                req.marker,
                "--hash" in text,
                where,
            )
        )
    return pins


def marker_env(python: str, machine: str) -> dict[str, str]:
    """PEP 508 marker values of CPython `python` on Linux `machine`."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",
    }


class Lock:
    """The versions of requirements/lock.txt (uv's universal lock: one version per package, markers)."""

    def __init__(self, paths: list[Path], root: Path):
        self.pins: dict[str, list[Pin]] = {}
        for path in paths:
            for pin in read_requirements(path, root):
                if pin.version is None:
                    raise InputError(
                        f"{pin.where}: the lock pins {pin.spec!r} with no single version (make lock)"
                    )
                self.pins.setdefault(pin.name, []).append(pin)

    def version(self, name: str, env: dict[str, str]) -> str | None:
        for pin in self.pins.get(name, []):
            if pin.marker is None or pin.marker.evaluate(env):
                return pin.version
        return None

    def problems(self, pins: list[Pin], env: dict[str, str]) -> list[str]:
        """Why `pins` are not the lock's for `env`: a pin that is not `==`, has no hash or another version."""
        found = []
        for pin in pins:
            if pin.version is None:
                found.append(
                    f"{pin.where}: {pin.spec!r} is not pinned (write {pin.name}==VERSION, the lock's version)"
                )
            elif not pin.hashed:
                found.append(f"{pin.where}: {pin.name}=={pin.version} has no --hash (make lock writes them)")
            elif pin.marker is None or pin.marker.evaluate(env):
                locked = self.version(pin.name, env)
                if locked is None:
                    found.append(
                        f"{pin.where}: {pin.name}=={pin.version} is not in the lock (add it to a "
                        f"requirements/*.in or *.txt file, then make lock)"
                    )
                elif locked != pin.version:
                    found.append(
                        f"{pin.where}: {pin.name}=={pin.version} differs from the lock's {pin.name}=={locked}"
                    )
        return found


def uv(args: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    """Run the venv's uv in `root` (which holds its settings: pyproject.toml [tool.uv])."""
    command = [
        shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv",
        *args,
        "--quiet",
        "--no-python-downloads",
        "--python-version",
        LAMBDA_PYTHON,
    ]
    return subprocess.run(command, check=False, cwd=root, capture_output=True, text=True, timeout=600)


def uv_findings(proc: subprocess.CompletedProcess[str], label: str, machine: str, report: Report) -> None:
    """Turn uv's resolution errors into findings; raise InstallerError for the rest."""
    error = " ".join(proc.stderr.split())  # uv wraps its messages to the terminal's width
    found = False
    for name in re.findall(r"Because (\S+?) has no usable wheels", error):
        report.fail(
            f"{label}: no wheel of {name} for CPython {LAMBDA_PYTHON} on {machine} ({GLIBC} or older)"
        )
        found = True
    for names in re.findall(r"no trusted hash was provided for: ((?:`[^`]+`,? ?)+)", error):
        report.fail(
            f"{label}: pulls in {', '.join(re.findall('`([^`]+)`', names))}, which is not pinned and "
            f"hashed (make lock)"
        )
        found = True
    if not found:
        raise InstallerError(f"{label}: {error[-1500:]}")


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` that sam build ships (no bytecode, symlinks not followed)."""
    total = 0
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in NOT_SHIPPED]
        total += sum((Path(folder) / f).lstat().st_size for f in files if not f.endswith(NOT_SHIPPED))
    return total


def dist_sizes(target: Path) -> dict[str, int]:
    """Bytes per installed distribution of a `--target` folder, from each RECORD."""
    sizes = {}
    for record in target.glob("*.dist-info/RECORD"):
        name = canonicalize_name(record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        files = (target / line.split(",", 1)[0] for line in record.read_text().splitlines())
        sizes[name] = sum(
            f.lstat().st_size for f in files if f.is_file() and not f.name.endswith(NOT_SHIPPED)
        )
    return sizes


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------------------------------- imports
def module_level_imports(folders: list[Path], root: Path) -> dict[str, list[str]]:
    """{top-level module: [file:line, ...]} of the absolute imports each module runs when imported
    (not those inside functions or `if TYPE_CHECKING:`), standard library and own modules left out."""
    own = {p.name.removesuffix(".py") for folder in folders for p in folder.iterdir()}
    found: dict[str, list[str]] = {}

    def walk(nodes: list[ast.stmt]) -> Iterator[tuple[str, int]]:
        for node in nodes:
            if isinstance(node, ast.Import):
                yield from ((alias.name.split(".")[0], node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield node.module.split(".")[0], node.lineno
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                for body in ("body", "orelse", "finalbody", "handlers"):
                    for part in getattr(node, body, []):
                        yield from walk(part.body if isinstance(part, ast.ExceptHandler) else [part])

    for folder in folders:
        for dirpath, dirs, files in os.walk(
            folder, followlinks=True
        ):  # an image's task root links its copies
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for path in (Path(dirpath, f).resolve() for f in sorted(files) if f.endswith(".py")):
                for module, line in walk(ast.parse(path.read_text(), str(path)).body):
                    if module not in sys.stdlib_module_names and module not in own and module != "__future__":
                        found.setdefault(module, []).append(f"{rel(path, root)}:{line}")
    return found


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def check_imports(label: str, folders: list[Path], shipped: set[str], root: Path, report: Report) -> None:
    """Fail on each module imported at module level whose distribution (in this venv) is not shipped."""
    providers = _providers()
    for module, where in sorted(module_level_imports(folders, root).items()):
        if not {canonicalize_name(d) for d in providers.get(module, [])} & shipped:
            more = f" and {len(where) - 2} more" if len(where) > 2 else ""
            report.fail(
                f"{label}: imports {module} ({', '.join(where[:2])}{more}) but ships no package providing it"
            )


_IMPORT_HANDLER = """
import importlib, sys
sys.path[:0] = {paths!r}
module, _, name = {handler!r}.replace("/", ".").rpartition(".")
if not callable(getattr(importlib.import_module(module), name, None)):
    sys.exit(f"{{module}} has no function {{name}}")
"""


def start_handler_import(handler: str, paths: list[Path], variables: dict[str, Any]) -> subprocess.Popen[str]:
    """Import `handler` (Lambda's `path/module.function`) in a fresh interpreter that sees only `paths`
    and this venv's site-packages (-I -S: no user site, no .pth files, so not the editable batchinfer)."""
    site = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env |= {
        k: v if isinstance(v, str) else str(v) if isinstance(v, int) else "unresolved"
        for k, v in variables.items()
    }
    code = _IMPORT_HANDLER.format(paths=[str(p) for p in paths] + site, handler=handler)
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ------------------------------------------------------------------------------------------- zip
@dataclass
class Unit:
    """A folder sam build copies and pip-installs a requirements.txt into: a layer or a zip function."""

    logical_id: str
    folder: Path
    pins: list[Pin] = field(default_factory=list)
    deps: dict[str, dict[str, int]] = field(default_factory=dict)  # arch -> {distribution: bytes}


def install_unit(unit: Unit, arch: str, workdir: Path, root: Path, report: Report) -> None:
    """Install the unit's requirements as sam build would for `arch`: binary wheels, hash-checked."""
    target = workdir / unit.logical_id / arch
    proc = uv(
        [
            "pip",
            "install",
            "--target",
            str(target),
            "--only-binary",
            ":all:",
            "--require-hashes",
            "--no-compile",
            "--python-platform",
            f"{MACHINES[arch]}-{GLIBC}",
            "-r",
            str(unit.folder / "requirements.txt"),
        ],
        root,
    )
    if proc.returncode:
        uv_findings(proc, f"{arch} {unit.logical_id}", MACHINES[arch], report)
    else:
        unit.deps[arch] = dist_sizes(target)


def zip_sizes(lid: str, mine: list[Unit], archs: list[str], report: Report) -> None:
    """Each architecture's unzipped size of a zip function: its CodeUri and its layers, with their wheels."""
    for arch in archs:
        if any(u.pins and arch not in u.deps for u in mine):
            print(f"{arch} {lid}: size unknown (a requirements file did not install)")
            continue
        parts = {u.logical_id: tree_bytes(u.folder) + sum(u.deps.get(arch, {}).values()) for u in mine}
        total, detail = sum(parts.values()), " + ".join(f"{name} {mb(n)}" for name, n in parts.items())
        if total > UNZIPPED_LIMIT_BYTES:
            report.fail(
                f"{arch} {lid}: {mb(total)} unzipped, over Lambda's {mb(UNZIPPED_LIMIT_BYTES)} ({detail})"
            )
        else:
            print(f"{arch} {lid}: {mb(total)} unzipped of {mb(UNZIPPED_LIMIT_BYTES)} ({detail})")


# ------------------------------------------------------------------------------------------- images
@dataclass
class PipInstall:
    """A `pip install` of a Dockerfile: the repository's files it installs with -r."""

    where: str
    files: list[Path]
    no_deps: bool
    pins: list[Pin]


@dataclass
class Image:
    """What a Dockerfile builds, as far as these checks go."""

    label: str
    task_root: Path  # the final stage's LAMBDA_TASK_ROOT, linked from the sources COPY puts there
    installs: list[PipInstall] = field(default_factory=list)


_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def substitute(text: str, values: dict[str, str], where: str, report: Report) -> str:
    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name not in values:
            report.fail(f"{where}: ${name} has no value (an ARG default or Metadata.DockerBuildArgs)")
            return match[0]
        return values[name]

    return _VARIABLE.sub(value, text)


def pip_installs(run: str) -> Iterator[list[str]]:
    """The arguments after `pip install` of each pip command of a RUN (shell form)."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("&|;()<>"):
            for i in range(len(words) - 1):
                if re.fullmatch(r"(\S*/)?pip3?(\.\d+)?", words[i]) and words[i + 1] == "install":
                    yield words[i + 2 :]
            words = []
        else:
            words.append(token)


def pip_install(
    args: list[str], copies: dict[str, Path], where: str, root: Path, report: Report
) -> PipInstall:
    """Check that a Dockerfile's `pip install` installs hashed requirement files only."""
    files, i = [], 0
    while i < len(args):
        if args[i] in ("-r", "--requirement"):
            i += 1
            if args[i] in copies:
                files.append(copies[args[i]])
            else:
                report.fail(f"{where}: pip install -r {args[i]}, a file no COPY of this stage provides")
        elif args[i].startswith("-"):
            i += args[i] in PIP_OPTIONS_WITH_VALUE
        else:
            report.fail(
                f"{where}: pip install {args[i]}: install from a hashed requirements file (make lock)"
            )
        i += 1
    if "--require-hashes" not in args:
        report.fail(f"{where}: pip install without --require-hashes")
    return PipInstall(
        where, files, "--no-deps" in args, [p for f in files for p in read_requirements(f, root)]
    )


def read_image(
    dockerfile: Path, context: Path, build_args: dict[str, str], stage_dir: Path, root: Path, report: Report
) -> Image:
    """Check a Dockerfile's base images, COPY sources and pip installs; lay out its task root."""
    if not dockerfile.is_file():
        raise InputError(f"no Dockerfile {dockerfile}")
    label = rel(dockerfile, root)
    image = Image(label, stage_dir)
    # What docker build receives of the context: docker-py (sam build's client) applies .dockerignore so.
    ignore = context / ".dockerignore"
    patterns = [line.strip() for line in (ignore.read_text().splitlines() if ignore.is_file() else [])]
    sent = exclude_paths(
        str(context),
        [p for p in patterns if p and not p.startswith("#")],
        dockerfile=str(dockerfile.relative_to(context)),
    )
    values = dict(build_args)  # the ARGs before the first FROM
    stages: list[dict[str, Any]] = []
    for ins in DockerfileParser(fileobj=io.BytesIO(dockerfile.read_bytes()), env_replace=False).structure:
        kind, text, where = ins["instruction"], ins["value"], f"{label}:{ins['startline'] + 1}"
        scope = stages[-1]["values"] if stages else values
        if kind == "ARG":
            name, _, default = text.partition("=")
            scope.setdefault(name.strip(), values.get(name.strip(), default.strip().strip('"')))
        elif kind == "FROM":
            base, *alias = substitute(text, values, where, report).split()
            if base not in {s["alias"] for s in stages}:
                tag = base.split("@")[0].rpartition("/")[2].partition(":")[2]
                if tag in ("", "latest") and "@" not in base:
                    report.fail(f"{where}: base image {base} has no version tag")
            stages.append(
                {
                    "alias": alias[-1] if alias else None,
                    "values": {"LAMBDA_TASK_ROOT": TASK_ROOT},
                    "copies": {},
                }
            )
        elif kind == "ENV" and stages:
            name, _, value = text.partition("=")
            scope[name.strip()] = substitute(value.strip().strip('"'), scope, where, report)
        elif kind in ("COPY", "ADD") and stages:
            value = substitute(text, scope, where, report)
            words = json.loads(value) if value.startswith("[") else shlex.split(value)
            if any(w.startswith("--from") for w in words):
                continue
            *sources, dest = [w for w in words if not w.startswith("--")]
            for source in sources:
                if os.path.normpath(source) not in sent:
                    report.fail(
                        f"{where}: {kind} source {source} is not in the build context {rel(context, root)}"
                        f"{' (.dockerignore)' if (context / source).exists() else ''}"
                    )
                stages[-1]["copies"][dest + Path(source).name if dest.endswith("/") else dest] = (
                    context / source
                )
        elif kind == "RUN" and stages:
            image.installs += [
                pip_install(args, stages[-1]["copies"], where, root, report) for args in pip_installs(text)
            ]
    if not stages:
        raise InputError(f"{label}: no FROM")
    for dest, source in stages[-1]["copies"].items():
        link = stage_dir / dest.removeprefix(TASK_ROOT + "/")
        if dest.startswith(TASK_ROOT + "/") and source.exists():
            if any(p.is_symlink() for p in link.parents if p.is_relative_to(stage_dir)):
                raise InputError(f"{label}: a COPY to {dest}, inside an earlier COPY, is not modelled here")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source.resolve())
    stage_dir.mkdir(parents=True, exist_ok=True)
    return image


def resolve_install(install: PipInstall, arch: str, workdir: Path, root: Path, report: Report) -> None:
    """Resolve a Dockerfile's pip install for `arch` as pip will in docker build: every package it pulls
    in must be pinned, and have a wheel unless it is BUILT_FROM_SOURCE."""
    command = [
        "pip",
        "compile",
        "--no-header",
        "--no-annotate",
        "--python-platform",
        f"{MACHINES[arch]}-{GLIBC}",
        "--only-binary",
        ":all:",
        *[a for name in BUILT_FROM_SOURCE for a in ("--no-binary", name)],
        *["--no-deps"] * install.no_deps,
        *[str(f) for f in install.files],
    ]
    proc = uv(command, root)
    label = f"{install.where} ({arch})"
    if proc.returncode:
        uv_findings(proc, label, MACHINES[arch], report)
        return
    resolved = {
        canonicalize_name(m[1]) for m in re.finditer(r"^([\w.-]+)(\[[^\]]*\])?==", proc.stdout, re.MULTILINE)
    }
    for name in sorted(resolved - {p.name for p in install.pins}):
        report.fail(
            f"{label}: pulls in {name}, which {', '.join(rel(f, root) for f in install.files)} do not "
            f"pin (make lock)"
        )


# ------------------------------------------------------------------------------------------- venv
def venv_check(lock: Lock, report: Report) -> None:
    """Every distribution of the running venv at the lock's version (the project and pip aside)."""
    env = marker_env(f"{sys.version_info[0]}.{sys.version_info[1]}", os.uname().machine)
    count, before = 0, len(report.failures)
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in ("pip", "batchinfer"):
            continue
        count += 1
        locked = lock.version(name, env)
        if locked != dist.version:
            report.fail(
                f"venv {sys.prefix}: {name}=={dist.version} is installed but the lock has "
                f"{f'{name}=={locked}' if locked else 'none'} (rebuild it: rm -rf .venv; make test)"
            )
    if len(report.failures) == before:
        print(f"venv {sys.prefix}: {count} packages, all at the lock's versions")


# ------------------------------------------------------------------------------------------- main
def check(
    root: Path, template_path: Path, lock: Lock, archs: list[str], workdir: Path, report: Report, venv: bool
) -> None:
    """Every check, in an order that overlaps the handler imports (CPU) with uv (network)."""
    template = load_template(template_path)
    resources = template["Resources"]
    functions = {
        lid: merge_function_globals(template, lid)
        for lid, r in resources.items()
        if r["Type"] == "AWS::Serverless::Function"
    }
    units = {
        lid: Unit(lid, root / r["Properties"]["ContentUri"])
        for lid, r in resources.items()
        if r["Type"] == "AWS::Serverless::LayerVersion"
    }
    zips = {lid: p for lid, p in functions.items() if p.get("PackageType", "Zip") == "Zip"}
    units |= {lid: Unit(lid, root / p["CodeUri"]) for lid, p in zips.items()}
    for unit in units.values():
        if not unit.folder.is_dir():
            raise InputError(f"{unit.logical_id}: no folder {unit.folder}")
        if (unit.folder / "requirements.txt").is_file():
            unit.pins = read_requirements(unit.folder / "requirements.txt", root)
    code: dict[str, list[Unit]] = {}  # zip function -> its CodeUri and layers
    for lid, props in zips.items():
        refs = [ref.get("Ref") if isinstance(ref, dict) else ref for ref in props.get("Layers") or []]
        if any(ref not in units for ref in refs):
            report.fail(f"{lid}: a layer that is not in the template, whose size cannot be counted: {refs}")
        code[lid] = [units[lid], *(units[ref] for ref in refs if ref in units)]
    images: dict[tuple[Path, str], Image] = {}  # (Dockerfile, build args) -> Image
    to_import = [(lid, props["Handler"], [u.folder for u in code[lid]], props) for lid, props in zips.items()]
    for lid, props in functions.items():
        if lid in zips:
            continue
        meta = resources[lid].get("Metadata") or {}
        context = root / meta.get("DockerContext", ".")
        build_args = {k: str(v) for k, v in (meta.get("DockerBuildArgs") or {}).items()}
        key = (context / meta.get("Dockerfile", "Dockerfile"), json.dumps(build_args, sort_keys=True))
        if key not in images:
            images[key] = read_image(
                key[0], context, build_args, workdir / "images" / str(len(images)), root, report
            )
        image = images[key]
        handler = ((props.get("ImageConfig") or {}).get("Command") or [""])[0]
        module = image.task_root / (handler.replace(".", "/").rpartition("/")[0] + ".py")
        if not handler or not module.is_file():
            report.fail(
                f"{lid}: the handler {handler!r} (ImageConfig.Command) is not a module that "
                f"{image.label} copies into {TASK_ROOT}"
            )
        else:
            print(f"{lid} (image, {image.label}): handler {handler} = {rel(module.resolve(), root)}")
            to_import.append((lid, handler, [image.task_root], props))
    running = [
        (
            lid,
            handler,
            start_handler_import(handler, paths, (p.get("Environment") or {}).get("Variables") or {}),
        )
        for lid, handler, paths, p in to_import
    ]

    targets: list[tuple[Callable[..., None], Unit | PipInstall]] = [
        (install_unit, u) for u in units.values() if u.pins
    ]
    targets += [(resolve_install, i) for image in images.values() for i in image.installs if i.files]
    jobs = []
    for arch in archs:
        for job, target in targets:
            problems = lock.problems(target.pins, marker_env(LAMBDA_PYTHON, MACHINES[arch]))
            for problem in problems:
                report.fail(problem)
            if not problems:  # else uv would stop at the first of the same findings
                jobs.append((job, target, arch))
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(job, target, arch, workdir, root, report) for job, target, arch in jobs]:
            future.result()

    for lid, mine in code.items():
        zip_sizes(lid, mine, archs, report)
        check_imports(lid, [u.folder for u in mine], {p.name for u in mine for p in u.pins}, root, report)
    for unit in units.values():
        for arch, sizes in sorted(unit.deps.items(), reverse=True):
            largest = ", ".join(f"{n} {mb(b)}" for n, b in sorted(sizes.items(), key=lambda kv: -kv[1])[:6])
            print(
                f"{arch} {unit.logical_id}: {len(sizes)} wheels, {mb(sum(sizes.values()))} ({largest}, ...)"
            )
    for image in images.values():
        shipped = {p.name for i in image.installs for p in i.pins}
        check_imports(image.label, [image.task_root], shipped, root, report)
        print(
            f"{image.label}: installs {len(shipped)} pinned packages, "
            f"{', '.join(sorted(BUILT_FROM_SOURCE & shipped)) or 'none'} built from source"
        )
    for lid, handler, proc in running:
        _, err = proc.communicate(timeout=300)
        if proc.returncode:
            last = (err.strip().splitlines() or ["?"])[-1]
            report.fail(f"{lid}: handler {handler} does not import from the code it ships with: {last}")
    print(f"handlers import: {', '.join(lid for lid, _, p in running if not p.returncode) or 'none'}")
    if venv:
        venv_check(lock, report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    parser.add_argument("--template", default="template.yaml", help="relative to --root")
    parser.add_argument(
        "--lock",
        action="append",
        help="relative to --root (default: requirements/lock.txt and requirements/model-data.txt)",
    )
    parser.add_argument("--arch", action="append", choices=sorted(MACHINES), help="default: both")
    parser.add_argument("--no-venv", action="store_true", help="skip the venv check")
    args = parser.parse_args(argv)
    started, root, report = time.monotonic(), args.root.resolve(), Report()
    archs = args.arch or sorted(MACHINES, reverse=True)
    # A tmpfs where there is one: removing the ~6,000 installed files from a disk took 4-8 s here.
    workdir = Path(
        tempfile.mkdtemp(
            prefix="check-artifacts-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        )
    )
    try:
        lock = Lock(
            [root / p for p in args.lock or ["requirements/lock.txt", "requirements/model-data.txt"]], root
        )
        check(root, root / args.template, lock, archs, workdir, report, not args.no_venv)
    except (InputError, TemplateError, OSError) as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 2
    except InstallerError as exc:
        print(f"ERROR uv failed: {exc}", file=sys.stderr)
        return 3
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    took = f"{time.monotonic() - started:.1f} s"
    if report.failures:
        print(f"check_artifacts: {len(report.failures)} failure(s) ({', '.join(archs)}) in {took}")
        return 1
    print(f"check_artifacts: OK ({', '.join(archs)}) in {took}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
