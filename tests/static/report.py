"""The verdict the static checks end with: every problem found, or one line saying all is well."""

from __future__ import annotations

import sys


def verdict(what: str, errors: list[str]) -> int:
    """Prints every error (or `what: ok`) and returns the exit status."""
    if errors:
        for err in errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"{what}: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print(f"{what}: ok")
    return 0
