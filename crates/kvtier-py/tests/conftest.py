"""Shared fixtures: kvtier's two Python APIs, and the reference wheel to compare with.

The reference (`tokenspeed-scheduler==0.1.0`) is unpacked by `cargo xtask py` into
target/tools/reference-wheel (or wherever KVTIER_REFERENCE_WHEEL points). Without it,
the tests that need it skip and say so; under CI=true they fail instead, so a missing
install step cannot hide.
"""

import importlib
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
REFERENCE_DIR = pathlib.Path(
    os.environ.get("KVTIER_REFERENCE_WHEEL", REPO / "target" / "tools" / "reference-wheel")
)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def load_reference():
    """The reference module, imported as `tokenspeed_scheduler` from its own directory
    (its package imports itself by that absolute name). kvtier's drop-in stays
    reachable as `kvtier.compat`."""
    if not (REFERENCE_DIR / "tokenspeed_scheduler" / "__init__.py").is_file():
        message = (
            f"the reference wheel tokenspeed-scheduler==0.1.0 is not unpacked at {REFERENCE_DIR} "
            "(run `cargo xtask py`, or set KVTIER_REFERENCE_WHEEL)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip("SKIPPED, NOT PASSED: " + message)
    loaded = sys.modules.get("tokenspeed_scheduler")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(REFERENCE_DIR)):
        for name in [n for n in sys.modules if n == "tokenspeed_scheduler" or n.startswith("tokenspeed_scheduler.")]:
            del sys.modules[name]
    if str(REFERENCE_DIR) not in sys.path:
        sys.path.insert(0, str(REFERENCE_DIR))
    module = importlib.import_module("tokenspeed_scheduler")
    assert str(module.__file__).startswith(str(REFERENCE_DIR)), module.__file__
    return module


@pytest.fixture(scope="session")
def reference():
    return load_reference()


@pytest.fixture(scope="session")
def ours():
    import kvtier.compat

    return kvtier.compat
