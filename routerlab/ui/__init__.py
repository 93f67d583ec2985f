"""The Gradio app: shared resources and per-visitor sessions, one module per tab, the layout, and the
plots (pure plotly, no torch).

    resources.py     Limits, router sets, prompts, Resources (shared by every visitor)
    stream.py        Decoder: decodes in a worker thread, the UI reads snapshots at its own pace
    session.py       Session (one visitor's state) and the helpers the tabs share
    explore.py       Explore tab: run, stop, steer, what-if
    compare.py       Compare tab: the threshold ladder (full model + up to three thresholds, in lockstep)
    tradeoff_tab.py  Trade-off tab: benchmark figures and table, quick sweep, row picking
    tradeoff_plots.py  the Trade-off tab's figures (quality vs skipped, measured vs ideal speedup, where the time goes)
    train_tab.py     Train tab: start, watch, stop a Router-Tuning job; the set in this tab's menu; zip download and upload
    train_plots.py   the Train tab's figures (curves, layers x steps map) and progress bar
    about.py         About tab: text and diagram
    layout.py        build_demo (components and event wiring), theme, launch options
    plots.py         every figure and HTML fragment
    safe.py          the one escaping helper: outside text shown literally in Markdown, HTML, toasts and plotly
    uploads.py       the upload guard: a disk budget per visitor and per server, other sites' pages refused
    fields.py        every field a visitor or a client sends, checked by type and range (components and handlers share it)

Knows nothing about tensors: handlers call `Engine.generate` and plotting functions, nothing else.
Nothing is loaded at import time; `app.py` loads the model and calls `build_demo(Resources(...))`.

Sharing rules (one model serves every visitor):
  - `Resources` is shared and read-mostly: engines, router sets, limits, the full-model speed.
  - `Session` (in a `gr.State`, one per browser tab or API client) holds that visitor's running
    `Control`s and last Trace. A slider event reaches the running generation only through it.

The constants re-exported here are copies: to change one (a test, a benchmark), set it on the
module that defines it, e.g. `routerlab.ui.state.stream.HEATMAP_INTERVAL`.
"""

from routerlab.ui.figures import plots
from routerlab.ui.layout import CSS_FILE, EXPORT_TTL, WHAT_IF_PREVIEW_JS, build_demo, enable_queue, launch_options, router_set_chosen, theme
from routerlab.ui.tabs.about import ABOUT_MD, DIAGRAM
from routerlab.ui.tabs.compare import LADDER, column_html, compare_run, decode_speed, ladder_html, ladder_rows, ladder_thresholds
from routerlab.ui.tabs.explore import STATS_INTERVAL, explore_run, show_last, stop_run, threshold_moved
from routerlab.ui.web.checked_inputs import NumberSlider
from routerlab.ui.state.resources import (
    FALLBACK_PROMPTS,
    FULL,
    PROMPTS_FILE,
    ROUTERS_DIR,
    UNTRAINED,
    Limits,
    Resources,
    RouterSetInfo,
    available_router_sets,
    load_prompts,
    operator_router_sets,
)
from routerlab.ui.state.session import Session, plot_data
from routerlab.ui.state.stream import HEATMAP_INTERVAL, TEXT_INTERVAL, Decoder, snapshot
from routerlab.ui.state.uploads import UploadBudget
from routerlab.ui.tabs.tradeoff_tab import BENCH_COLUMNS, BENCH_DIR, bench_summary, bench_table, load_bench, load_results, tradeoff_figures, tradeoff_pick, tradeoff_sweep

__all__ = [
    "ABOUT_MD",
    "BENCH_COLUMNS",
    "BENCH_DIR",
    "CSS_FILE",
    "DIAGRAM",
    "EXPORT_TTL",
    "FALLBACK_PROMPTS",
    "FULL",
    "HEATMAP_INTERVAL",
    "LADDER",
    "PROMPTS_FILE",
    "ROUTERS_DIR",
    "STATS_INTERVAL",
    "TEXT_INTERVAL",
    "UNTRAINED",
    "WHAT_IF_PREVIEW_JS",
    "Decoder",
    "Limits",
    "NumberSlider",
    "Resources",
    "RouterSetInfo",
    "Session",
    "UploadBudget",
    "available_router_sets",
    "operator_router_sets",
    "bench_summary",
    "bench_table",
    "build_demo",
    "column_html",
    "compare_run",
    "decode_speed",
    "explore_run",
    "ladder_html",
    "ladder_rows",
    "ladder_thresholds",
    "enable_queue",
    "launch_options",
    "load_bench",
    "load_prompts",
    "load_results",
    "plot_data",
    "plots",
    "router_set_chosen",
    "show_last",
    "snapshot",
    "stop_run",
    "theme",
    "threshold_moved",
    "tradeoff_figures",
    "tradeoff_pick",
    "tradeoff_sweep",
]
