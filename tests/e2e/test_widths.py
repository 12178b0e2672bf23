"""Issue 26, defects 6 and 7: the charts and the Planner table at a phone's width (390 px) and a
desktop's (1400 px), measured in a real browser: every legend inside its chart's box with all its
entries, no label over another label, a rule or a bar, the Planner's numbers on screen.

Vega draws the charts as SVG: each mark, label and legend is an element with a box
(getBoundingClientRect), measured here whether or not the chart's container clips it.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from estimator import estimate_config, load_config
from estimator.speed.roofline import roofline_config
from ui.charts import phase_rows, stage_rows
from ui.fields import ModelChoice, ui_values_from_config, url_params
from ui.roofline_charts import step_parts

from .conftest import ARTIFACTS, wait_for_app

RL_LINK = ("model=qwen2.5-7b&framework=fsdp2&micro_batch_size=16&global_batch_size=1280&recompute=full&dp=8"
           "&rl_algorithm=grpo&rl_rollout_batch_size=1024&rl_samples_per_prompt=5&rl_max_prompt_len=512"
           "&rl_max_response_len=512&rl_engine_memory_fraction=0.6&rl_rollout_tp=2")
RL_CONFIG = {"model": "qwen2.5-7b",
             "training": {"framework": "fsdp2", "micro_batch_size": 16, "global_batch_size": 1280,
                          "recompute": "full",
                          "rl": {"algorithm": "grpo", "rollout_batch_size": 1024, "samples_per_prompt": 5,
                                 "max_prompt_len": 512, "max_response_len": 512, "engine_memory_fraction": 0.6,
                                 "rollout_tp": 2}},
             "parallel": {"dp": 8}}
PIPELINE_LINK = "model=llama-3.1-70b&tp=8&pp=4&vpp=5&dp=2&seq_len=8192&recompute=selective"
# the peak stage just under the GPU's capacity (97%), and just over it (109%), both peaking in forward
NEAR_LIMIT = {"model": "qwen2.5-7b", "training": {"seq_len": 2048}, "parallel": {"tp": 2}}
OVER_LIMIT = {"model": "llama-3.1-8b", "training": {"seq_len": 4096}, "parallel": {"tp": 2}}

# Every chart on the page: its box, its axis titles, its legend's box and labels, and the boxes of
# its text marks, rules and bars (Vega's SVG renderer: g.mark-<type> groups, role-* classes).
_CHARTS_JS = """() => Array.from(document.querySelectorAll('.vega-embed')).map(embed => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const all = sel => Array.from(embed.querySelectorAll(sel));
  const legend = embed.querySelector('.role-legend');
  return {
    box: box(embed),
    axes: all('.role-axis-title text').map(t => t.textContent),
    legend: legend ? box(legend) : null,
    labels: all('.role-legend-label text').map(t => ({text: t.textContent, box: box(t)})),
    texts: all('.mark-text text').map(t => ({text: t.textContent, box: box(t)})),
    rules: all('.mark-rule.role-mark line').map(box),
    bars: all('.mark-rect.role-mark path').map(box),
  };
})"""


def _open(browser, url: str, width: int):
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(90_000)
    page.goto(url)
    wait_for_app(page, 1500)
    return context, page


def _charts(page) -> list[dict]:
    """Every chart of the page, each scrolled into view first (a chart may draw once it is shown)."""
    embeds = page.locator(".vega-embed")
    embeds.first.wait_for()
    for i in range(embeds.count()):
        embeds.nth(i).scroll_into_view_if_needed()
        embeds.nth(i).locator("svg.marks .role-mark").first.wait_for(state="attached")
    page.wait_for_timeout(500)
    return page.evaluate(_CHARTS_JS)


def _chart(charts: list[dict], axis_title: str) -> dict:
    return next(c for c in charts if axis_title in c["axes"])


def _inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["left"] >= outer["left"] - slack and inner["right"] <= outer["right"] + slack
            and inner["top"] >= outer["top"] - slack and inner["bottom"] <= outer["bottom"] + slack)


def _overlap(a: dict, b: dict) -> bool:
    """Boxes that share more than a pixel each way."""
    return (min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1
            and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1)


def _crosses(rule: dict, label: dict) -> bool:
    """A horizontal rule (a box of no height) through a label's box."""
    return (min(rule["right"], label["right"]) - max(rule["left"], label["left"]) > 1
            and label["top"] < rule["top"] < label["bottom"])


def _legend_fits(chart: dict, entries: set[str], name: str) -> None:
    assert chart["legend"] is not None, f"{name}: no legend"
    assert _inside(chart["legend"], chart["box"]), f"{name}: legend {chart['legend']} outside its chart {chart['box']}"
    for label in chart["labels"]:
        assert _inside(label["box"], chart["box"]), f"{name}: legend label {label['text']!r} cut off"
    shown = [label["text"] for label in chart["labels"]]
    assert len(shown) == len(entries), f"{name}: legend shows {len(shown)} of {len(entries)} entries"
    for text in shown:  # a label cut to its column ends in an ellipsis; it is still the entry's start
        assert any(entry.startswith(text.rstrip("…")) for entry in entries), f"{name}: unknown label {text!r}"


def _components(est) -> set[str]:
    return {row["component"] for row in stage_rows(est)}


# --- 6. a phone's width ----------------------------------------------------------------------------

def test_the_rl_and_stage_charts_hold_their_legends_on_a_phone(browser, app_url):
    context, page = _open(browser, f"{app_url}/?{RL_LINK}", 390)
    try:
        charts = _charts(page)
        page.screenshot(path=str(ARTIFACTS / "memory-rl-390.png"))
        est = estimate_config(RL_CONFIG)
        rl = _chart(charts, "GiB per GPU")  # the RL phases' horizontal bars: GiB on the x axis
        _legend_fits(rl, {c.label for phase in est.rl_phases for c in phase.components if c.bytes}, "RL phases")
        assert rl["bars"] and all(b["right"] - b["left"] >= 0 for b in rl["bars"])
        plot_width = max(b["right"] for b in rl["bars"]) - min(b["left"] for b in rl["bars"])
        assert plot_width > 0.4 * (rl["box"]["right"] - rl["box"]["left"]), "the bars got no room beside the legend"
        _legend_fits(_chart(charts, "Pipeline stage"), _components(est), "stages")
    finally:
        context.close()
    context, page = _open(browser, f"{app_url}/?{PIPELINE_LINK}", 390)
    try:
        est = estimate_config({"model": "llama-3.1-70b", "training": {"seq_len": 8192, "recompute": "selective"},
                               "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}})
        charts = _charts(page)
        _legend_fits(_chart(charts, "Pipeline stage"), _components(est), "stages, 4 stages")
        peak = est.stages[est.peak_stage]
        phases = {row["component"] for row in phase_rows(peak)}
        _legend_fits(_chart(charts, "Phase of the step"), phases, "phases")
    finally:
        context.close()


def test_the_roofline_pages_step_chart_holds_its_legend(browser, app_url):
    step = roofline_config(load_config({"model": "llama-3.1-70b", "training": {"seq_len": 8192,
                                                                               "recompute": "selective"},
                                        "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}})).to_json()["step"]
    parts = {p["part"] for p in step_parts(step)}
    assert len(parts) >= 5
    for width in (1400, 390):
        context, page = _open(browser, f"{app_url}/roofline?{PIPELINE_LINK}", width)
        try:
            _legend_fits(_chart(_charts(page), "seconds per step"), parts, f"step time at {width} px")
        finally:
            context.close()


def test_the_planner_tables_memory_and_speed_are_on_screen_at_1400px(browser, app_url):
    """The grid draws on a canvas; its accessible table lists the columns in view (a virtualised
    grid renders the cells of the columns its box shows). GiB and tokens/s must be among them with
    a column after them, so neither is cut at the grid's edge."""
    context, page = _open(browser, f"{app_url}/planner?model=llama-3.1-8b&dp=8", 1400)
    try:
        page.get_by_role("button", name="Plan").click()
        wait_for_app(page, 1000)
        grid = page.get_by_test_id("stDataFrame").first
        grid.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        box = grid.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1400
        in_view = [h.inner_text() for h in grid.locator("[role=columnheader]").all()]
        for name in ("GiB per GPU", "Tokens/s per GPU"):
            assert name in in_view[:-1], f"{name!r} is not fully in view: {in_view}"
    finally:
        context.close()


# --- 7. labels that collide ----------------------------------------------------------------------------

def _query(config: dict) -> str:
    return urlencode(url_params(ModelChoice(source="preset", preset=config["model"]),
                                ui_values_from_config(config)), doseq=True)


@pytest.mark.parametrize("width", [1400, 390])
def test_the_peak_and_capacity_labels_stay_clear_of_each_other_the_rule_and_the_bars(browser, app_url, width):
    for name, config in (("near the limit", NEAR_LIMIT), ("over the limit", OVER_LIMIT)):
        est = estimate_config(config)
        assert est.stages[est.peak_stage].peak_phase == "forward"
        context, page = _open(browser, f"{app_url}/?{_query(config)}", width)
        try:
            chart = _chart(_charts(page), "Pipeline stage")
            page.screenshot(path=str(ARTIFACTS / f"stages-{name.replace(' ', '-')}-{width}.png"))
        finally:
            context.close()
        texts = chart["texts"]
        peak = next(t for t in texts if t["text"] == "peak (forward)")
        capacity = next(t for t in texts if "GPU capacity" in t["text"])
        assert f"{est.fit.capacity_bytes / 1024**3:.1f} GiB" in capacity["text"]
        assert not _overlap(peak["box"], capacity["box"]), f"{name}: the peak and capacity labels overlap"
        for rule in chart["rules"]:
            assert not _crosses(rule, peak["box"]), f"{name}: the capacity rule crosses the peak label"
        for bar in chart["bars"]:
            assert not _overlap(capacity["box"], bar), f"{name}: the capacity label lies on a bar"
            assert not _overlap(peak["box"], bar), f"{name}: the peak label lies on a bar"


# --- 9. a value cut on the Roofline page ---------------------------------------------------------------

def test_the_roofline_pages_values_read_whole_at_1400px_in_inference(browser, app_url):
    """A metric cuts its value with an ellipsis when it is wider than its column: the element's
    content box (scrollWidth) wider than its own box (clientWidth)."""
    link = "model=llama-3.1-8b&mode=inference&tp=8&seq_len=131072&micro_batch_size=32"  # 10.4 s exposed
    context, page = _open(browser, f"{app_url}/roofline?{link}", 1400)
    try:
        metrics = page.get_by_test_id("stMetric")
        metrics.first.wait_for()
        assert metrics.count() == 6
        cut = metrics.evaluate_all("""els => els.flatMap(m => [m, ...m.querySelectorAll('*')])
            .filter(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)""")
        assert cut == [], cut
        page.screenshot(path=str(ARTIFACTS / "roofline-inference-1400.png"))
    finally:
        context.close()
