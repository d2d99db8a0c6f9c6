import subprocess
import sys

HEAVY = ["torch", "plotly", "ipywidgets", "pandas", "numba", "cupy", "anywidget"]


def test_import_kvlab_loads_nothing_heavy():
    code = (
        "import sys, kvlab; kvlab.MODELS; kvlab.backend;"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_attributes():
    import kvlab

    assert kvlab.PagedKVCache.__name__ == "PagedKVCache"
    assert kvlab.cache.BlockPool is kvlab.BlockPool
    assert callable(kvlab.dashboard)
    try:
        kvlab.no_such_thing  # noqa: B018
    except AttributeError as err:
        assert "no_such_thing" in str(err)
    else:
        raise AssertionError("expected AttributeError")


def test_accounting_needs_no_torch():
    code = "import sys, kvlab.cache.accounting, kvlab.workload; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
