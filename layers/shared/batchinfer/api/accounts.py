"""Who is calling. One account until API keys arrive; every route scopes its reads and writes by it."""

from __future__ import annotations

DEFAULT_ACCOUNT = "default"


def current_account() -> str:
    """The caller's account id."""
    return DEFAULT_ACCOUNT
