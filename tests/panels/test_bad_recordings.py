"""Every tab with each recording it reads broken (truncated, `{}`, `[]`, entries of the wrong
shape): the tab says which file cannot be read and why, where that recording would be shown; its
other views and the other tabs work (CPU, "sim" backend, a results folder of its own)."""

import html
import json
import shutil

import pytest

import kvlab
import kvlab.results
from kvlab.panels.decode_kernels import DecodeKernelsTab
from kvlab.panels.e2e import EndToEndTab
from kvlab.panels.kvpr import KVPRTab
from kvlab.panels.l2 import L2Tab
from kvlab.results import results_dir

MIXED = {"lengths": "lognormal:3200,16384"}
# tab, recording, its lists of entries, the controls that show it, the figures that say why
RECORDINGS = [
    (DecodeKernelsTab, "h200/attention", ("rows",), {}, ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/attention_block_sizes", ("rows",), {}, ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/attention_read", ("rows",), {}, ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/attention_fp8", ("rows",), {"kv_dtype": "fp8"},
     ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/attention_mixed", ("rows",), MIXED, ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/attention_block_order", ("rows",), {"blocks": "in order"},
     ("bandwidth", "speedup")),
    (DecodeKernelsTab, "h200/timeline", ("rows",), {}, ("timeline",)),
    (DecodeKernelsTab, "h200/timeline_mixed", ("rows",), MIXED, ("timeline",)),
    (KVPRTab, "h200/kvpr_opt", ("rows", "timelines"), {}, ("overlap", "speedup")),
    (KVPRTab, "h200/kvpr_llama", ("rows", "timelines"), {}, ("overlap", "speedup")),
    (KVPRTab, "h200/kvpr_schedules", ("rows", "timelines"), {}, ("overlap", "speedup")),
    (L2Tab, "h200/counters_sms", ("table",), {}, ()),
    (L2Tab, "h200/counters_prefetch", ("table",), {}, ()),
    (L2Tab, "h200/counters_block32", ("table",), {}, ()),
    (L2Tab, "h200/attention_sms", ("rows",), {}, ("regime",)),
    (EndToEndTab, "h200/e2e", ("rows",), {}, ("throughput", "steps", "tensor_parallel")),
    (EndToEndTab, "h200/e2e_qwen7b", ("rows",), {}, ("throughput", "steps", "tensor_parallel")),
    (EndToEndTab, "h200/e2e_qwen14b", ("rows",), {},
     ("throughput", "steps", "tensor_parallel")),
    (EndToEndTab, "h200/e2e_serving", ("serving",), {}, ()),
    (EndToEndTab, "h200x2/e2e", ("rows",), {}, ("tensor_parallel",)),  # not recorded: made here
    (EndToEndTab, "h200/steptrace_4k", ("rows",), {"batch": 16}, ("trace",)),
]


@pytest.fixture(scope="module")
def copied(tmp_path_factory):
    """The recorded results, copied once into a folder of the module's own."""
    root = tmp_path_factory.mktemp("results")
    shutil.copytree(results_dir(), root, dirs_exist_ok=True)
    return root


def recorded(root, where: str) -> dict:
    """The intact recording `where` ("machine/name"); h200x2/e2e: h200/e2e, as 2 GPUs."""
    if where == "h200x2/e2e":
        return {**recorded(root, "h200/e2e"), "tp": 2}
    return json.loads((root / f"{where}.json").read_text())


@pytest.fixture
def write(copied, monkeypatch):
    """write(where, data): `data` (bytes) as the recording `where` in the copied results, the
    loader pointed there; every file put back as it was afterwards."""
    saved = {}

    def write_(where, data):
        path = copied / f"{where}.json"
        saved.setdefault(path, path.read_bytes() if path.exists() else None)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        return path

    monkeypatch.setattr(kvlab.results, "results_dir", lambda: copied)
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    yield write_
    for path, data in saved.items():
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)


def breakage(root, where: str, how: str) -> tuple[bytes, str]:
    """The recording `where` broken `how` (one of HOW, or "<list>: <one of HOW_LISTS>"): its bytes
    and a part of why it cannot be read. Its lists are cut to their first entries (the loader
    reads the keys in order, so what is broken is what it names)."""
    good = {k: v[:2] if isinstance(v, list) else v for k, v in recorded(root, where).items()}
    if how == "truncated":
        text = json.dumps(good).encode()
        return text[:len(text) // 2], "not a JSON recording"
    if how == "{}":
        return b"{}", "no key"
    if how == "[]":
        return b"[]", "holds a JSON array: must hold an object"
    key, _, how = how.partition(": ")
    entries = good[key][:1]  # [] where none is recorded (kvpr_schedules' timelines)
    entry = entries[0] if entries else {"model": "llama3-8b"}
    broken, why = {
        "an object": ({}, f"'{key}' holds a JSON object: must be an array of objects"),
        "numbers": ([1, 2], f"{key}[0] = 1: must be an object"),
        "{}": ([*entries, {}], f"{key}[{len(entries)}] = {{}}: must be an object with the keys"),
        "short of a key": ([dict(list(entry.items())[1:])], "missing"),  # its first key left out
    }[how]
    return json.dumps({**good, key: broken}).encode(), why


HOW = ("truncated", "{}", "[]")
HOW_LISTS = ("an object", "numbers", "{}", "short of a key")


def texts(tab, figures=None) -> str:
    """What the tab shows in words: its status and its figures' titles and notes."""
    panes = [tab.figures[n] for n in (figures if figures is not None else tab.figures)]
    parts = [tab.status.value if figures is None else ""]
    for pane in panes:
        layout = pane.figure.layout
        parts += [layout.title.text or "", *(a.text or "" for a in layout.annotations)]
    return html.unescape("\n".join(parts).replace("<br>", ""))


CASES = [pytest.param(tab, where, how, controls, figures, id=f"{tab.__name__}-{where}-{how}")
         for tab, where, lists, controls, figures in RECORDINGS
         for how in (*HOW, *(f"{key}: {h}" for key in lists for h in HOW_LISTS))]


@pytest.mark.parametrize("tab_class,where,how,controls,figures", CASES)
def test_a_tab_says_which_recording_is_unreadable_and_why(copied, write, tab_class, where, how,
                                                         controls, figures):
    data, why = breakage(copied, where, how)
    path = write(where, data)
    tab = tab_class()
    for name, value in controls.items():
        tab.controls[name].value = value
    assert str(path) in texts(tab) and why in texts(tab)
    if figures:
        shown = texts(tab, figures)
        assert f"unreadable recording:{path}" in shown and why in shown, shown
    else:  # the status line says so
        assert f"unreadable recording: {path}: " in html.unescape(tab.status.value)


OTHER_VIEWS = [("h200/attention_fp8", {}), ("h200/attention", {"kv_dtype": "fp8"}),
               ("h200/attention", MIXED), ("h200/attention", {"blocks": "in order"}),
               ("h200/timeline", {"kv_dtype": "fp8"})]


@pytest.mark.parametrize("where,controls", OTHER_VIEWS)
def test_the_decode_kernels_views_of_other_recordings_still_draw(write, where, controls):
    write(where, b"{")
    tab = DecodeKernelsTab()
    for name, value in controls.items():
        tab.controls[name].value = value
    assert tab.figures["bandwidth"].figure.data, "no bars"
    assert "unreadable" not in texts(tab, ["bandwidth"])


def test_kvpr_models_its_curves_with_what_if_rates_where_its_recording_is_unreadable(write):
    path = write("h200/kvpr_opt", b"[]")
    tab = KVPRTab()
    names = [t.name for t in tab.figures["split"].figure.data]
    assert "pipelined model" in names
    assert "what-if rates" in tab.figures["split"].figure.layout.title.text
    assert f"unreadable recording: {path}" in tab.status.value


@pytest.mark.parametrize("tab_class,where,controls", [
    pytest.param(tab, where, controls, id=where) for tab, where, _, controls, _ in RECORDINGS])
def test_one_unreadable_recording_leaves_the_dashboard_up(write, tab_class, where, controls):
    path = write(where, b'{"rows": [')
    dash = kvlab.dashboard()
    (mine,) = [tab for tab in dash.tabs if tab.key == tab_class.key]
    for name, value in controls.items():  # the view that shows the recording
        mine.controls[name].value = value
    assert str(path) in texts(mine)
    for tab in dash.tabs:
        assert all(pane.outputs for pane in tab.figures.values()), tab.key
        if tab is not mine:
            assert "unreadable" not in texts(tab), tab.key
