import pathlib
import sys

import pytest

_PYTHON = pathlib.Path(__file__).resolve().parents[2] / "python"
if str(_PYTHON) not in sys.path:  # PYTHONPATH=python is then optional
    sys.path.insert(0, str(_PYTHON))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "fuzz: the long random run, only with `-m fuzz` (tests/python/test_fuzz.py)")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ModuleNotFoundError:
        has_cuda = False
    skip = pytest.mark.skip(reason="no CUDA device")
    long_run = "fuzz" in (config.getoption("markexpr") or "")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)
        if "fuzz" in item.keywords and not long_run:
            item.add_marker(pytest.mark.skip(reason="the long fuzz run needs `-m fuzz`"))


@pytest.fixture(scope="session")
def flashcute_library():
    """Skips the test when libflashcute.so is not built (or FLASHCUTE_LIBRARY points nowhere)."""
    from flashcute import _capi
    if _capi.library_path() is None:
        pytest.skip("flashcute library not built: bash scripts/build.sh, or set FLASHCUTE_LIBRARY")
    return _capi.lib()
