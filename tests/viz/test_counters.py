"""kvlab.viz.counters (CPU): the paper's Table 5.2 beside the H200's, and the L2 model's answer;
nothing drawn over anything else on a chart of some 530 px (the dashboard at 1,000 px)."""

from kvlab.profile import paper
from kvlab.sim.l2 import L2Result
from kvlab.viz.counters import modelled_l2_figure, table_5_2_figure


def entry(column, baseline, prefetch, model="llama2-7b"):
    return {"model": model, "kernel": "vllm_v1", "batch": 1, "context": 32768,
            "num_sms_used": 132, "prefetch": "bulk K+V d=1", "column": column,
            "ours_baseline": baseline, "ours_prefetch": prefetch}


def lines(fig) -> list[str]:
    return [line.replace("<sub>", "").replace("</sub>", "")
            for line in fig.layout.title.text.split("<br>")]


def test_table_5_2_puts_each_h200_fact_on_a_line_of_its_own():
    fig = table_5_2_figure("llama2-7b", [entry("l2_hit_pct", 1.0, 40.0),
                                         entry("speedup", 1.0, 1.02)], "the paper<br>the H200")
    assert lines(fig) == [
        "The paper's counters, llama2-7b",
        f"{paper.GPU}: {paper.SPEEDUP['llama2-7b']:.2f}x kernel speedup with prefetch",
        "H200: 1.02x kernel speedup with prefetch, by ncu's durations",
        "H200: vllm_v1, batch 1 x 32768, 132 SMs, bulk K+V d=1",
        "the paper", "the H200"]
    assert all(len(line) <= 72 for line in lines(fig))


def test_a_model_the_paper_lacks_but_the_h200_has_is_titled_by_the_table():
    fig = table_5_2_figure("opt-6.7b", [entry("l2_hit_pct", 1.0, 40.0, model="opt-6.7b")], "p")
    assert lines(fig)[:2] == ["Table 5.2's counters: opt-6.7b", "the paper has no opt-6.7b"]
    assert any(t.y[0] == 1.0 for t in fig.data if t.name == "H200, no prefetch")


def test_a_model_neither_has_is_a_note_not_empty_axes():
    fig = table_5_2_figure("opt-13b", [entry("l2_hit_pct", 1.0, 40.0)], "the paper", 420)
    assert fig.data == () and fig.layout.height == 420
    assert lines(fig) == ["Table 5.2's counters: opt-13b", "the paper"]
    (note,) = fig.layout.annotations
    assert "the paper has no opt-13b" in note.text
    assert "python -m kvlab bench counters --models opt-13b" in note.text


def test_the_modelled_figure_has_no_panel_titles_over_its_bars():
    """A title above each panel sat where the bars' text is ("87.5%", "52 us / DRAM 60%");
    the axis titles name the panels."""
    results = {"none": L2Result(demand_misses=100), "bulk K+V d=1": L2Result(
        demand_hits=90, demand_misses=10, prefetch_misses=90, prefetch_used=90)}
    fig = modelled_l2_figure(results, "a launch", "modelled", 360,
                             {"none": 0.05, "bulk K+V d=1": 0.04}, 4000.0)
    assert fig.layout.annotations == ()
    assert fig.layout.yaxis.title.text == "% of loads' sectors"
    assert fig.layout.yaxis2.title.text == "us, modelled"
    time = next(t for t in fig.data if t.name == "time (time model)")
    assert fig.layout.yaxis2.range[1] >= 1.45 * max(time.y)  # room for two lines of text
    # two columns of entries: two rows below the chart, not four
    assert (fig.layout.legend.entrywidth, fig.layout.legend.entrywidthmode) == (0.5, "fraction")
    assert max(len(t.name) for t in fig.data) <= 30
    assert all(len(line) <= 72 for line in lines(fig))


def test_the_modelled_figure_takes_its_title_and_detail_lines():
    results = {"none": L2Result(demand_misses=100)}
    fig = modelled_l2_figure(results, "a launch", "modelled for a GPU", 360,
                             title="L2, modelled for NVIDIA H20",
                             details=("replayed: 1 of 8 sequences on 10 of 78 SMs",))
    assert lines(fig) == ["L2, modelled for NVIDIA H20", "a launch",
                          "replayed: 1 of 8 sequences on 10 of 78 SMs", "modelled for a GPU"]
    assert lines(modelled_l2_figure(results, "a launch", "modelled"))[0] == "L2, modelled"
