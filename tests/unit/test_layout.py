"""The installed packages stay readable: small folders, small modules, no test doubles.

A folder with more than a dozen modules is asking for subpackages named after what they
do; a module over 350 lines is asking to be split; fakes and test helpers live under
tests/, not in what `pip install` ships.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "worker", "shared", "fleet")
# The tests are grouped the same way (unit/<package>/<concern>, e2e, support); their files may
# be long (a property test's state machine), their folders may not be crowded.
FOLDERS = (*PACKAGES, "tests")
MAX_MODULES_PER_FOLDER = 12
MAX_MODULE_LINES = 350
ENTRY_MODULES = {"__init__.py", "__main__.py"}
TEST_ONLY_PREFIXES = ("fake", "testing", "test_", "conftest", "mock")


def package_folders() -> list[Path]:
    return sorted(
        folder
        for top in FOLDERS
        for folder in [REPO / top, *(REPO / top).rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__"
    )


def modules() -> list[Path]:
    return sorted(path for top in PACKAGES for path in (REPO / top).rglob("*.py"))


def test_no_package_folder_holds_more_than_a_dozen_modules():
    crowded = {
        str(folder.relative_to(REPO)): count
        for folder in package_folders()
        if (count := sum(p.name not in ENTRY_MODULES for p in folder.glob("*.py")))
        > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def test_no_module_is_over_350_lines():
    long = {
        str(path.relative_to(REPO)): lines
        for path in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_installed_packages_hold_no_test_doubles():
    test_only = [
        str(path.relative_to(REPO))
        for top in PACKAGES
        for path in (REPO / top).rglob("*")
        if path.name.lower().startswith(TEST_ONLY_PREFIXES)
        and (path.suffix == ".py" or path.is_dir())
    ]
    assert not test_only, f"test-only modules in installed packages: {test_only}"
