"""The real-world failure cases (tests/fixtures/cases/README.md): small inputs from bug reports of
systems like this one, each naming a kind of fault."""

from pathlib import Path

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
