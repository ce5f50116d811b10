"""The installed packages ship no test doubles: fakes and test helpers live under tests/.

There is no line or module-count rule: files are split by concept, never by count
(CONTRIBUTING.md). The old caps (350 lines, 12 modules a folder) were met by packing lines
and splitting owners from their helpers, which made the code harder to read (issue 49).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "worker", "shared", "fleet")
TEST_ONLY_PREFIXES = ("fake", "testing", "test_", "conftest", "mock")


def test_installed_packages_hold_no_test_doubles():
    test_only = [
        str(path.relative_to(REPO))
        for top in PACKAGES
        for path in (REPO / top).rglob("*")
        if path.name.lower().startswith(TEST_ONLY_PREFIXES)
        and (path.suffix == ".py" or path.is_dir())
    ]
    assert not test_only, f"test-only modules in installed packages: {test_only}"
