"""The page: components, look and event wiring; `build_demo(res)` is the whole app.

Owns `build_demo` (the settings column, the five tabs, and which handler each event calls with
which inputs and outputs, API names and concurrency), the theme, `launch_options`
(theme, CSS, the in-browser what-if preview script), `EXPORT_TTL`, and `router_set_chosen` (the
settings column's own handler). Knows nothing about how a run is streamed or drawn: the tabs'
handlers live in explore.py, compare.py and tradeoff_tab.py, and nothing here touches tensors.
Nothing is loaded at import time; `app.py` loads the model and calls `build_demo(Resources(...))`.
"""

from __future__ import annotations

import gradio as gr

from routerlab.core.base.config import GRANULARITIES, KV_POLICIES
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS
from routerlab.tuning.job import JobSettings
from routerlab.ui.figures import plots, safe
from routerlab.ui.figures import tradeoff_plots, train_plots
from routerlab.ui.state import fields, served
from routerlab.ui.state.resources import UNTRAINED, Limits, Resources
from routerlab.ui.state.session import Session, _delete_session, _status, _warn, close_tab, keep_session
from routerlab.ui.tabs import side_by_side
from routerlab.ui.tabs.about import ABOUT_MD, DIAGRAM
from routerlab.ui.tabs.compare import HEAT_EMPTY, LADDER, column_html, compare_run
from routerlab.ui.tabs.explore import explore_run, show_last, stop_run, threshold_moved
from routerlab.ui.tabs.links import COPY_LINK_JS, TABS, View, link_note_done, open_link, view_link
from routerlab.ui.tabs.tradeoff_tab import bench_summary, bench_table, column_widths, load_results, tradeoff_figures, tradeoff_pick, tradeoff_sweep
from routerlab.ui.tabs.train_tab import BUILT_IN, OWN, STARTS, TRAIN_INTRO, own_set, train_start, train_stop, train_tick, upload_set
from routerlab.ui.web import heatmap_export, queue_wait
from routerlab.ui.web.checked_inputs import (CheckedCheckbox, CheckedDropdown, CheckedRadio, CheckedTextbox, LadderNumber,
                                         UploadedFile, checked, examples as example_list, field_number, field_slider)
from routerlab.ui.state.uploads import UploadBudget, middleware as upload_guard, visitor_of_request
from routerlab.ui.web.http_guard import body_limit, middleware as page_guard

CSS_FILE = ASSETS / "css" / "app.css"
THRESHOLD_INFO = "a routed layer runs when its score ≥ threshold; move it during a run to steer, after a run for a what-if view"
EXPORT_TTL = 3600  # seconds gradio keeps a served export (a run's trace; ui/state/exports.py bounds them too); swept every 10 min


DOC_LABEL = "Long document (1,600-2,100 tokens)"
DOC_INFO = "fills the prompt with a text and its task; the status says how long reading it takes here; skipping saves more at long contexts"


def _doc_titles(res: Resources) -> list[str]:
    return [d.title for d in res.documents]


def document_chosen(res: Resources, title):
    """A long document picked: its text and task go into the prompt box (the status says how long it is)."""
    try:
        prompt = res.document_prompt(title)
    except RouterLabError as err:
        return gr.skip(), _warn(err)
    return prompt, _status("ok", f"Prompt: **{safe.text(title)}** ({len(prompt):,} characters) and its task. Press **Generate** "
                                 f"(or **Compare**); {_reading_time(res, prompt)} The status line counts the prompt's tokens while "
                                 "the model reads them.")


def _reading_time(res: Resources, prompt: str) -> str:
    """How long reading `prompt` takes here: from the server's recent long prompts, or said to be unmeasured yet."""
    rate = res.reading_rate()
    if rate is None:
        return "how long reading it takes depends on this machine (no long prompt has been read here yet)."
    tokens = len(res.engine.tokenizer(prompt)["input_ids"])
    return (f"reading its ~{tokens:,} tokens takes about {max(1, round(tokens / rate))} s here (this server read its recent long "
            f"prompts at {rate:,.0f} tokens/s; more while others generate).")


def router_set_chosen(res: Resources, label: str, session: Session | None = None, current=None, start: float | None = None):
    """A router set was chosen (shipped, or trained or uploaded in this tab): the KV policy it was trained for, and
    its calibrated threshold, unless the visitor set the slider themselves (`current` differs from the value the app
    last put there: a set's calibration, else `start`, the page's first): then their threshold stays, and the status
    says so and names the set's own."""
    own = own_set(session, label)
    info = own[0] if own else next((r for r in res.router_sets if r.label == label), None)
    if info is None or info.path is None:  # the full model or untrained routers: no calibration to show
        return gr.Slider(info=THRESHOLD_INFO), gr.skip(), gr.skip()
    threshold, policy = float(info.meta.get("threshold", 0.5)), info.meta.get("kv_policy", "kv")
    auto = getattr(session, "threshold_auto", None)
    auto = start if auto is None else auto
    typed = isinstance(current, (int, float)) and not isinstance(current, bool) and 0.0 <= current <= 1.0
    if typed and auto is not None and abs(float(current) - auto) > 1e-9:
        return (
            gr.Slider(info=_threshold_info(info.expected_skips)),
            gr.Radio(value=policy),
            _status("ok", f"Router set **{safe.text(label)}**: your threshold **{float(current):.2f}** stays (its calibrated one is "
                          f"{threshold:.2f}); trained for the **{safe.text(policy)}** KV policy."),
        )
    if session is not None:
        session.threshold_auto = threshold
    return (
        gr.Slider(value=threshold, info=_threshold_info(info.expected_skips)),
        gr.Radio(value=policy),
        _status("ok", f"Router set **{safe.text(label)}**: threshold set to its calibrated {threshold:.2f}; trained for the **{safe.text(policy)}** KV policy."),
    )


# In-browser what-if preview: re-split the final heatmap's recorded scores at the new threshold
# (a cell runs iff score >= threshold, as in Trace.executed_matrix) without waiting for the server,
# which then sends the full view (changed-cell tint, stats, text, layer plots). Installed on page
# load as plain DOM listeners on the threshold inputs: a Gradio `js=` listener on the slider would
# make the browser hold the slider's server event until a running stream ends (no live steering).
WHAT_IF_PREVIEW_JS = """
() => {
  const preview = (threshold) => {
    try {
      const gd = document.querySelector('#rl-heatmap .js-plotly-plot');
      const meta = gd && gd.layout && gd.layout.meta;
      if (!window.Plotly || !meta || meta.routerlab !== 'final' || !gd.data || gd.data.length < 2) return;
      const generate = document.querySelector('#rl-generate');
      if (generate && generate.disabled) return;  // a run is going: the slider steers it, no what-if
      if (meta.what_if !== undefined && Math.abs(meta.what_if - threshold) < 1e-9) return;  // the server's view is already here
      const unpack = (z) => {  // a 2-D array, or plotly's base64 typed-array spec
        if (Array.isArray(z)) return {rows: z.length, cols: z[0].length, get: (r, c) => (z[r][c] === null ? NaN : z[r][c])};
        const bytes = Uint8Array.from(atob(z.bdata), (ch) => ch.charCodeAt(0));
        const flat = z.dtype === 'f8' ? new Float64Array(bytes.buffer) : new Float32Array(bytes.buffer);
        const [rows, cols] = String(z.shape).split(',').map(Number);
        return {rows, cols, get: (r, c) => flat[r * cols + c]};
      };
      const a = unpack(gd.data[0].z), b = unpack(gd.data[1].z);  // ran, skipped: together every routed score
      const ran = [], skipped = [];
      for (let r = 0; r < a.rows; r++) {
        const rr = new Array(a.cols), sr = new Array(a.cols);
        for (let c = 0; c < a.cols; c++) {
          const v = Number.isNaN(a.get(r, c)) ? b.get(r, c) : a.get(r, c);
          rr[c] = !Number.isNaN(v) && v >= threshold ? v : null;
          sr[c] = !Number.isNaN(v) && v < threshold ? v : null;
        }
        ran.push(rr); skipped.push(sr);
      }
      // one redraw: new z for ran/skipped, the changed-cell tint (if any) hidden, the title; the quality strip stays
      const tint = gd.data.findIndex((t) => t.name === 'differs from recorded');
      const traces = tint >= 0 ? [0, 1, tint] : [0, 1];
      const z = tint >= 0 ? [ran, skipped, gd.data[tint].z] : [ran, skipped];
      Plotly.update(gd, {z: z, visible: traces.map((i) => i < 2)},
        {'title.text': '<b>WHAT-IF</b> at threshold ' + Number(threshold).toFixed(2) + ', re-decided in your browser from the recorded scores (not a new run) …'}, traces);
    } catch (err) { console.warn('RouterLab what-if preview:', err); }
  };
  const onInput = (e) => {
    const el = e.target;
    if (!el || !el.closest || !el.closest('#rl-threshold')) return;
    if (e.type === 'input' && el.type !== 'range') return;  // typing a number: wait for Enter / blur
    if (e.type === 'keydown' && e.key !== 'Enter') return;
    const value = parseFloat(el.value);
    if (Number.isNaN(value) || value === last) return;
    if (e.type !== 'input') { last = value; preview(value); return; }  // a release or Enter: draw now
    pending = value;  // while dragging: only the latest value, once per frame
    requestAnimationFrame(() => { if (pending === null) return; last = pending; pending = null; preview(last); });
  };
  let pending = null, last = null;
  for (const kind of ['input', 'change', 'keydown']) document.addEventListener(kind, onInput, true);
  window.routerlabWhatIfPreview = preview;  // for tests and the curious
}
"""


# The live heatmap: a stream's heatmap frames come through a hidden gr.HTML (`live_heat`) and are drawn with
# Plotly.react into the heatmap plot already on the page. Through gr.Plot itself, every new figure remounts the
# plot (a fresh div and a full Plotly draw, Gradio 6's Plot component): a fifth to two fifths more main-thread time
# per frame than a react on the plot that is there (docs/results.md, "Streaming overhead, measured: where the page's
# time goes"). A run starts by showing a placeholder figure in gr.Plot and ends by sending its final figure there; a
# frame is never drawn over a final figure (layout.meta.routerlab), so a late frame cannot cover the finished run.
LIVE_HEATMAP_JS = """
watch('value', () => {
  try {
    const frame = props.value;
    const gd = document.querySelector('#rl-heatmap .js-plotly-plot');
    if (!frame || !gd || !window.Plotly) return;
    const meta = gd.layout && gd.layout.meta;
    if (meta && meta.routerlab === 'final') return;
    const fig = JSON.parse(frame);
    const margin = fig.layout.margin = fig.layout.margin || {};
    if (fig.layout.title) margin.t = Math.max(100, margin.t || 0);  // as gr.Plot lays out a titled figure under its label
    margin.autoexpand = true;
    fig.layout.autosize = true;
    Plotly.react(gd, fig.data, fig.layout, {responsive: true});
  } catch (err) { console.warn('RouterLab live heatmap:', err); }
});
"""


def theme():
    # System fonts only: the app must look right offline (a workshop laptop without network).
    return gr.themes.Soft(
        primary_hue="orange",
        neutral_hue="stone",
        font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
        font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "SFMono-Regular", "Menlo", "monospace")],
    )


# Gradio's queue looks for work every millisecond while it is empty or its workers are all busy (queueing.Queue's
# sleep_when_free on Linux) and for progress every 10 ms: ~900 wake-ups a second of the web server's event loop, 5.6% of
# a core with nobody on the page (a 2-core Xeon, /proc's CPU ticks of that thread over 10 s), and the same while a room
# is served, CPU the decoding needs. These intervals keep it to tens of wake-ups; a press waits at most QUEUE_POLL_S more.
QUEUE_POLL_S = 0.02
PROGRESS_POLL_S = 0.1  # a sweep's progress bar moves at most this often


def enable_queue(demo: gr.Blocks, limits: Limits):
    """`demo.queue(...)` with the operator's caps (`limits`) and the polling intervals above; returns `demo`."""
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)
    queue = getattr(demo, "_queue", None)  # Gradio's own queue object: its intervals are plain attributes
    if queue is not None:
        queue.sleep_when_free = max(getattr(queue, "sleep_when_free", 0.0), QUEUE_POLL_S)
        queue.progress_update_sleep_when_free = max(getattr(queue, "progress_update_sleep_when_free", 0.0), PROGRESS_POLL_S)
    return demo


def launch_options(limits: Limits | None = None, uploads: UploadBudget | None = None) -> dict:
    """Keyword arguments for `demo.launch` that carry the look (Gradio 6 takes theme/css at launch) and the upload caps.

    run_history=False: Gradio's run history deep-copies every output of every streamed frame in the
    browser (a JSON round trip of the heatmap) and rewrites localStorage twice a second; that was a
    large share of the browser's time while streaming, CPU a laptop's decoder also needs.
    max_file_size: Gradio refuses a larger upload before storing it (ROUTERLAB_MAX_UPLOAD_MB; `limits`: the
    environment's when not given).
    app_kwargs: the page's guard (http_guard.py: a body cap from the training text's, file fields that take uploads
    only, the framing headers, plotly.js for the page's exports), then the upload guard (uploads.py: the disk budget
    per visitor and per server, other sites' pages refused; `uploads`: the environment's budget when not given)."""
    limits = limits or Limits.from_env()
    uploads = uploads or UploadBudget.from_env()
    page = page_guard(body_limit(limits.training_max_chars), uploads.allowed_origins)
    return dict(theme=theme(), css_paths=[str(CSS_FILE)] if CSS_FILE.is_file() else None, js=WHAT_IF_PREVIEW_JS,
                run_history=False, max_file_size=limits.max_upload_mb * 2**20,
                app_kwargs={"middleware": [page, queue_wait.middleware(), upload_guard(uploads)]})


def threshold_help(res: Resources, label: str) -> str:
    """The slider's help text for a shipped router set (its measured skip rates), or the plain one."""
    info = next((r for r in res.router_sets if r.label == label), None)
    return _threshold_info(info.expected_skips if info is not None and info.path is not None else "")


def _threshold_info(marks: str) -> str:
    """The slider's help text, with a calibrated set's measured skip rates along it when it has them."""
    return f"{THRESHOLD_INFO}. {marks}" if marks else THRESHOLD_INFO


def _tradeoff_intro(results: dict) -> str:
    if not results["rows"] and results["speed"] is None and results["heldout"] is None:
        return ("No benchmark results ship with this build yet (`assets/bench/`). Run a quick sweep on the Explore prompt: "
                "tokens/s and agreement with the full model's greedy output, per threshold.")
    model = (results["speed"] or results["heldout"] or {}).get("model", "the shipped model")
    return (f"Speed against quality, from the benchmark results in `assets/bench/` ({safe.text(model)}; `make bench`, `make tradeoff`, "
            f"`make heldout-sampled` measure them again). {bench_summary(results)}")


def build_demo(res: Resources) -> gr.Blocks:
    """The whole app. Handlers are bound to `res`; per-visitor state lives in a gr.State(Session)."""
    limits = res.limits
    labels = res.router_labels()
    # Default: a shipped token-level set (the threshold steers it live), else any shipped set.
    shipped = [r for r in res.router_sets if r.path is not None]
    default_set = next((r for r in shipped if r.granularity.endswith("-token")), shipped[0] if shipped else None)
    default_routers = default_set.label if default_set else UNTRAINED
    start_threshold = float(default_set.meta.get("threshold", 0.5)) if default_set else 0.5
    start_policy = default_set.meta.get("kv_policy", "kv") if default_set else "kv"
    prompt_field = fields.PROMPT.within(limits.max_prompt_chars)
    with gr.Blocks(title="RouterLab: see and steer dynamic depth", analytics_enabled=False, delete_cache=(600, EXPORT_TTL)) as demo:
        session = gr.State(Session(), delete_callback=_delete_session)
        gr.Markdown("# RouterLab\nWatch a language model skip attention layer by layer, and steer how much it skips.", elem_id="rl-title")
        status = gr.Markdown(res.status, elem_id="rl-status")
        with gr.Accordion("This machine's engine", open=False, elem_id="rl-engine"):
            gr.Markdown(res.details, elem_id="rl-engine-details")
        link_note = gr.Markdown(visible=False, elem_id="rl-link-note")  # what a link opened (or could not), see links.py
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=260, elem_id="rl-settings"):
                threshold = field_slider(fields.THRESHOLD, value=start_threshold, step=0.01, info=_threshold_info(default_set.expected_skips if default_set else ""), elem_id="rl-threshold")
                router_label = CheckedDropdown(labels, value=default_routers, label="Granularity (router set)", info="shipped router sets, untrained zero routers, or the full model", elem_id="rl-granularity")
                kv_policy = CheckedRadio(list(KV_POLICIES), value=start_policy, label="KV policy", info="mask: no saving · kv: same output, less work · drop: most saving, different output (see About)", elem_id="rl-kv")
                max_new = field_slider(fields.MAX_NEW_TOKENS.within(maximum=limits.max_new_tokens), value=min(96, limits.max_new_tokens), step=1, elem_id="rl-max-new")
                temperature = field_slider(fields.TEMPERATURE, value=0.0, step=0.05, info="0 = greedy", elem_id="rl-temperature")
                measure = checked(CheckedCheckbox(value=True, label=fields.MEASURE_QUALITY.label, info="each token's KL to the full model and its top token, scored in chunks (slows decoding a little)", elem_id="rl-quality"), fields.MEASURE_QUALITY)
                model = CheckedDropdown(res.model_choices, value=res.default_model, label="Model", visible=len(res.model_choices) > 1, info="models the operator allows (ROUTERLAB_ALLOWED_MODELS)", elem_id="rl-model")
                link_btn = gr.Button("Copy link to this view", size="sm", elem_id="rl-copy-link")
                link_box = gr.Textbox(label="Link to this view: these settings, this tab, this prompt", visible=False, interactive=False,
                                      buttons=["copy"], elem_id="rl-link")
            with gr.Column(scale=4):
                with gr.Tabs(selected="explore", elem_id="rl-tabs") as tabs:
                    with gr.Tab("Explore", id="explore", elem_id="rl-tab-explore") as tab_explore:
                        prompt = checked(CheckedTextbox(value=res.prompts[0], label="Prompt", lines=3, max_lines=8, max_length=limits.max_prompt_chars, elem_id="rl-prompt"), prompt_field)
                        examples = example_list(res.prompts, prompt, label="Example prompts", elem_id="rl-examples")
                        doc_pick = CheckedDropdown(_doc_titles(res), value=None, label=DOC_LABEL, info=DOC_INFO, visible=bool(res.documents), elem_id="rl-doc")
                        with gr.Row():
                            go_btn = gr.Button("Generate", variant="primary", elem_id="rl-generate")
                            regen_btn = gr.Button("Regenerate at this threshold", elem_id="rl-regenerate")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="rl-stop")
                        text = gr.HTML(plots.token_html(None), elem_id="rl-text")
                        stats = gr.HTML(plots.stats_html({}), elem_id="rl-stats")
                        with gr.Row(equal_height=True):
                            vs_btn = gr.Button(side_by_side.LABEL, size="sm", scale=0, min_width=320, elem_id="rl-vs-full")
                            vs_text = gr.Markdown(side_by_side.FIRST_NOTE,
                                                  elem_classes=["rl-muted"], elem_id="rl-vs-text")
                        heat = gr.Plot(plots.empty_heatmap(), label="Layers × tokens", elem_id="rl-heatmap")
                        live_heat = gr.HTML("", html_template="<span></span>", js_on_load=LIVE_HEATMAP_JS, visible="hidden", elem_id="rl-live-heat")
                        with gr.Row():
                            trace_dl = gr.DownloadButton("Download trace (JSON)", visible=False, size="sm", elem_id="rl-dl-trace")
                            html_dl = gr.Button(heatmap_export.LABEL, visible=False, size="sm", elem_id="rl-dl-html")
                        gr.Markdown("PNG: use the camera icon in the heatmap's toolbar.", elem_classes=["rl-muted"])
                    with gr.Tab("Compare", id="compare", elem_id="rl-tab-compare") as tab_compare:
                        gr.Markdown("A **threshold ladder**: the same prompt through the **full model** and the router set on the left at up to three thresholds, "
                                    "one token each in turn, so their speeds are measured side by side. Higher threshold = more skipped. Leave a box empty for fewer columns.")
                        c_prompt = checked(CheckedTextbox(value=res.prompts[0], label="Prompt", lines=2, max_lines=6, max_length=limits.max_prompt_chars, elem_id="rl-c-prompt"), prompt_field)
                        c_doc_pick = CheckedDropdown(_doc_titles(res), value=None, label=DOC_LABEL, info=DOC_INFO, visible=bool(res.documents), elem_id="rl-c-doc")
                        with gr.Row(equal_height=True):
                            c_thresholds = [LadderNumber(t, minimum=0.0, maximum=1.0, step=0.01, label=f"Threshold {k + 1}", min_width=120, elem_id=f"rl-c-t{k + 1}") for k, t in enumerate(LADDER)]
                            c_btn = gr.Button("Compare", variant="primary", elem_id="rl-compare")
                            c_stop = gr.Button("Stop", variant="stop", elem_id="rl-c-stop")
                        c_stats = gr.HTML("", elem_id="rl-c-stats")
                        with gr.Row(elem_id="rl-ladder-cols"):
                            c_columns = [gr.HTML(column_html(None, None, t), elem_id=f"rl-c-col{k}") for k, t in enumerate([None, *LADDER])]
                        c_heat = gr.Plot(plots.empty_heatmap(HEAT_EMPTY), label="Highest threshold: layers × tokens", elem_id="rl-c-heatmap")
                    with gr.Tab("Trade-off", id="tradeoff", elem_id="rl-tab-tradeoff") as tab_tradeoff:
                        results = load_results(calibrations={r.granularity: r.meta.get("calibration") for r in reversed(shipped)})
                        fig_quality, fig_speed, fig_time = tradeoff_figures(results)
                        gr.Markdown(_tradeoff_intro(results), elem_id="rl-t-intro")
                        t_plot = gr.Plot(fig_quality, label="What skipping costs", elem_id="rl-tradeoff")
                        gr.Plot(fig_speed, label="Measured vs ideal speedup", elem_id="rl-t-speed")
                        gr.Plot(fig_time, label="Where the time goes", elem_id="rl-t-time")
                        gr.Plot(tradeoff_plots.context_curve(results.get("context")), label="Where skipping pays: context length", elem_id="rl-t-context")
                        gr.Markdown("Every row of the trade-off sweep. **Click a tuned row** to use its threshold in Explore." + (
                            f" Thresholds of {safe.text(', '.join(results['calibrated']))} are on the slider's calibrated scale (the sweep ran on raw router scores)." if results["calibrated"] else ""),
                            elem_classes=["rl-muted"])
                        table = bench_table(results["df"])
                        t_table = gr.Dataframe(table, interactive=False, wrap=True, max_height=420, column_widths=column_widths(table), elem_id="rl-t-table")
                        t_btn = gr.Button("Run a quick sweep on the Explore prompt (about a minute)", elem_id="rl-sweep")
                        # the visitor's own sweep goes beside the shipped benchmark, never over it
                        s_plot = gr.Plot(visible=False, label="Your quick sweep, on this machine, now", elem_id="rl-sweep-plot")
                        s_table = gr.Dataframe(visible=False, interactive=False, wrap=True, label="Your quick sweep: every run", elem_id="rl-sweep-table")
                    with gr.Tab("Train", id="train", elem_id="rl-tab-train") as tab_train:
                        gr.Markdown(TRAIN_INTRO if limits.training else "Training is turned off on this server (ROUTERLAB_TRAINING=off).")
                        with gr.Row(equal_height=True):
                            tr_gran = CheckedDropdown(list(GRANULARITIES), value="attention-token", label="What to route", elem_id="rl-tr-gran",
                                                  info="target x level, as the shipped sets")
                            tr_skip = field_slider(fields.SKIP_TARGET, value=15, step=1, elem_id="rl-tr-skip")
                            tr_minutes = field_slider(fields.MINUTES.within(maximum=limits.training_minutes), value=min(3.0, limits.training_minutes), step=0.5,
                                                      info="the whole job: data, training, evaluation", elem_id="rl-tr-minutes")
                        tr_source = CheckedRadio([BUILT_IN, OWN], value=BUILT_IN, label="Data", elem_id="rl-tr-source",
                                             info="built-in: the shipped prompts answered by the full model; yours: pasted or uploaded below")
                        with gr.Row():
                            tr_text = checked(CheckedTextbox(label=f"{fields.TRAIN_TEXT.label}: paragraphs separated by blank lines, or JSON lines (messages / instruction / prompt / text)",
                                                                 lines=4, max_lines=12, elem_id="rl-tr-text"), fields.TRAIN_TEXT.within(limits.training_max_chars))
                            tr_file = UploadedFile(label="… or a .txt / .jsonl file", file_types=[".txt", ".jsonl"], type="filepath", elem_id="rl-tr-file")
                        with gr.Accordion("Advanced", open=False):
                            with gr.Row():
                                tr_lr = field_number(fields.LEARNING_RATE, JobSettings.lr, elem_id="rl-tr-lr")
                                tr_kd = field_number(fields.KD_WEIGHT, JobSettings.kd_weight, elem_id="rl-tr-kd")
                                tr_lm = field_number(fields.LM_WEIGHT, JobSettings.lm_weight, elem_id="rl-tr-lm")
                                tr_steps = field_number(fields.MAX_STEPS, JobSettings.max_steps, elem_id="rl-tr-steps")
                                tr_init = CheckedRadio(list(STARTS), value=next(iter(STARTS)), label="Routers start from", elem_id="rl-tr-init")
                        with gr.Row():
                            tr_start = gr.Button("Start training", variant="primary", interactive=limits.training, elem_id="rl-tr-start")
                            tr_stop = gr.Button("Stop", variant="stop", elem_id="rl-tr-stop")
                        tr_progress = gr.HTML(train_plots.progress_html(None, 1.0), elem_id="rl-tr-progress")
                        tr_curves = gr.Plot(train_plots.curves(None), label="Learning curves", elem_id="rl-tr-curves")
                        tr_layers = gr.Plot(train_plots.layer_map(None), label="Which layers it learns to skip", elem_id="rl-tr-layers")
                        tr_result = gr.Markdown("", elem_id="rl-tr-result")
                        with gr.Row():
                            tr_download = gr.DownloadButton("Download (zip)", visible=False, elem_id="rl-tr-download")
                            tr_upload = UploadedFile(label="Upload a router set: its zip, or router.json + routers.safetensors", file_count="multiple",
                                                file_types=[".zip", ".json", ".safetensors", ".md"], elem_id="rl-tr-upload")
                        tr_upload_note = gr.Markdown("", elem_id="rl-tr-upload-note")
                        tr_timer = gr.Timer(2.0, active=False)
                    with gr.Tab("Layers", id="layers", elem_id="rl-tab-layers") as tab_layers:
                        gr.Markdown("Per-layer view of the last Explore run (follows the what-if threshold after a run).")
                        l_bar = gr.Plot(plots.layer_skip_bar(None), label="Skip rate per layer", elem_id="rl-layer-bar")
                        l_hist = gr.Plot(plots.score_histogram(None), label="Router scores per layer", elem_id="rl-layer-hist")
                    with gr.Tab("About", id="about", elem_id="rl-tab-about") as tab_about:
                        gr.HTML(DIAGRAM)
                        gr.Markdown(ABOUT_MD)

        tab_shown = gr.State("explore")  # the tab on screen, for the copied link (a gr.Tabs has no value to read)

        run_inputs = [prompt, threshold, router_label, kv_policy, max_new, temperature, model, session, measure]  # the switch last: API callers may leave it out
        run_outputs = [text, heat, stats, status, trace_dl, html_dl, l_bar, l_hist, go_btn, live_heat]

        # API handlers: Gradio names an endpoint's parameters after the handler's own, input by input (a *args
        # handler shows param_0, param_1, ...), and leaves the gr.State `session` out. Their docstrings are the
        # endpoints' descriptions in the client's view_api().
        def _explore(prompt, threshold, router_set, kv_policy, max_new_tokens, temperature, model, session, measure_quality=True):
            """Generate from the prompt with the router set at the threshold, streaming text, heatmap, stats and status."""
            for values in explore_run(res, prompt, threshold, router_set, kv_policy, max_new_tokens, temperature, model, session, measure_quality):
                yield served.ready(run_outputs, values)  # postprocessed here: the events below are bound postprocess=False

        def _show_last(session):
            return show_last(res, session)

        def _moved(threshold, session):
            """Steer this tab's running generation from its next token, or show the last run's what-if view."""
            return threshold_moved(res, threshold, session)

        def _compare(prompt, threshold_1, threshold_2, threshold_3, router_set, kv_policy, max_new_tokens, temperature, model, session):
            """The prompt through the full model and the router set at up to three thresholds (None: fewer columns;
            threshold_1 may also hold the whole ladder as a string, e.g. "0.3, 0.5, 0.7")."""
            yield from compare_run(res, prompt, [threshold_1, threshold_2, threshold_3], router_set, kv_policy, max_new_tokens, temperature, model, session)

        def _sweep(prompt, router_set, kv_policy, model, session, progress=gr.Progress()):
            """A quick sweep: tokens/s and agreement with the full model's greedy output, per threshold."""
            fig, table, said = tradeoff_sweep(res, prompt, router_set, kv_policy, model, progress, session.router_sets if isinstance(session, Session) else None)
            if table is None:  # refused: what was there stays
                return gr.skip(), gr.skip(), said
            return gr.Plot(fig, visible=True), gr.Dataframe(table, visible=True, column_widths=column_widths(table)), said

        def _train(session, granularity, skip_target, minutes, learning_rate, kd_weight, lm_weight, max_steps, init, source, text=None, file=None,
                   request: gr.Request = None):
            """Queue a router training for this tab (skip_target in % of routed cells; file: a .txt or .jsonl path)."""
            return train_start(res, session, granularity, skip_target, minutes, learning_rate, kd_weight, lm_weight, max_steps, init, source, text, file,
                               visitor=visitor_of_request(request))

        limit = max(1, limits.concurrency)
        # Every event of a line must give it the same limit: Gradio lowers a line's limit to the lowest any of its events
        # asks for, at that event's first push. Side-by-side measurements (the sweep, Explore's button) decode in this
        # process one at a time: a line of their own, "lockstep", so the first one does not make "gen" one-at-a-time.
        # Generations share one line ("gen"); one that would wait past ROUTERLAB_MAX_WAIT_S is refused as it joins, with
        # the wait said at its prompt box (queue_wait.py, via launch_options' guard); Gradio shows the others their place.
        queue_wait.register(demo, queue_wait.WaitCap(demo, limits.max_wait_s, line="gen"))
        gen_evt = go_btn.click(_explore, run_inputs, run_outputs, api_name="generate", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal", postprocess=False)
        prompt_evt = prompt.submit(_explore, run_inputs, run_outputs, api_name=False, concurrency_limit=limit, concurrency_id="gen", show_progress="minimal", postprocess=False)
        regen_evt = regen_btn.click(_explore, run_inputs, run_outputs, api_name="regenerate", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal", postprocess=False)
        def _measure(prompt, threshold, router_set, kv_policy, model, session):
            """The routed speed against the full model's, decoded side by side on the Explore prompt (32 tokens each)."""
            return side_by_side.measure_beside_full(res, session, prompt, threshold, router_set, kv_policy, model)

        def _after_run(prompt, threshold, router_set, kv_policy, model, session):
            return side_by_side.after_run(res, session, prompt, threshold, router_set, kv_policy, model)

        measure_inputs = [prompt, threshold, router_label, kv_policy, model, session]
        vs_btn.click(_measure, measure_inputs, [vs_text, status], api_name="measure_vs_full",
                     concurrency_limit=1, concurrency_id="lockstep", show_progress="minimal")
        for trigger in (go_btn.click, prompt.submit, regen_btn.click):  # a new run: the last run's measurement is no longer its
            trigger(lambda: side_by_side.RUN_NOTE, None, vs_text, api_name=False, queue=False, show_progress="hidden")
        stop_btn.click(side_by_side.stopped, [session], vs_text, api_name=False, queue=False, show_progress="hidden")
        for evt in (gen_evt, prompt_evt, regen_evt):  # the speed card after each routed run that had the server to itself
            evt.success(_after_run, measure_inputs, [vs_text, status], api_name=False, concurrency_limit=1, concurrency_id="lockstep", show_progress="hidden")
        html_dl.click(None, js=heatmap_export.EXPORT_HEATMAP_JS)  # made in the browser: the server keeps no page
        stop_btn.click(stop_run, [session], [status], api_name="stop", cancels=[gen_evt, prompt_evt, regen_evt], queue=False).then(
            _show_last, [session], run_outputs, api_name=False
        )
        threshold.change(
            _moved, [threshold, session], [heat, text, stats, status, l_bar, l_hist],
            api_name="set_threshold", trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
        )
        cmp_evt = c_btn.click(_compare, [c_prompt, *c_thresholds, router_label, kv_policy, max_new, temperature, model, session], [*c_columns, c_stats, c_heat, status],
                              api_name="compare", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal")
        c_stop.click(stop_run, [session], [status], api_name="stop_compare", queue=False)  # every column ends; the stream shows them
        examples.click(examples.prompt, [examples], [prompt], api_name="load_example", show_progress="hidden", queue=False)
        doc_pick.input(lambda title: document_chosen(res, title), [doc_pick], [prompt, status], api_name=False, queue=False)
        c_doc_pick.input(lambda title: document_chosen(res, title), [c_doc_pick], [c_prompt, status], api_name=False, queue=False)
        router_label.input(lambda label, s, t: router_set_chosen(res, label, s, t, start_threshold), [router_label, session, threshold],
                           [threshold, kv_policy, status], api_name=False)
        t_table.select(tradeoff_pick, [t_table], [threshold, tabs, status], api_name=False)
        t_btn.click(_sweep, [prompt, router_label, kv_policy, model, session], [s_plot, s_table, status], api_name="sweep", concurrency_limit=1, concurrency_id="lockstep")
        tr_start.click(_train, [session, tr_gran, tr_skip, tr_minutes, tr_lr, tr_kd, tr_lm, tr_steps, tr_init, tr_source, tr_text, tr_file],
                       [tr_progress, tr_curves, tr_layers, tr_result, status, tr_timer, tr_start], api_name="train", concurrency_limit=None)
        tr_timer.tick(lambda s: train_tick(res, s), [session], [tr_progress, tr_curves, tr_layers, tr_result, status, tr_timer, router_label, tr_download, tr_start],
                      api_name=False, concurrency_limit=None, show_progress="hidden")
        tr_stop.click(train_stop, [session], [status], api_name="stop_training", queue=False).then(  # frees Start at once
            lambda s: train_tick(res, s), [session], [tr_progress, tr_curves, tr_layers, tr_result, status, tr_timer, router_label, tr_download, tr_start],
            api_name=False, queue=False, show_progress="hidden")
        def _uploaded(files, s):
            said, menu, box = upload_set(res, s, files)
            return said, menu, box, said  # the status line, and the same words beside the upload box (out of view otherwise)
        tr_upload.upload(_uploaded, [tr_upload, session], [status, router_label, tr_upload, tr_upload_note], api_name=False, concurrency_limit=None)

        # Links that open a state (links.py): applied on page load; the copied link is made absolute in the browser.
        start_view = View(prompt=res.prompts[0], routers=default_routers, max_new_tokens=min(96, limits.max_new_tokens))
        link_outputs = [tabs, tab_shown, prompt, c_prompt, router_label, threshold, kv_policy, max_new, temperature, measure, link_note,
                        doc_pick, c_doc_pick]

        def _open_link(s, request: gr.Request):
            out = open_link(res, start_view, request, s)
            routers, threshold = out[4], out[5]
            if not isinstance(routers, str):  # gr.skip(): the URL carries no settings
                return out
            # the slider's help names the linked set's measured skip rates (links.py cannot import this module)
            return (*out[:5], gr.Slider(value=threshold, info=threshold_help(res, routers)), *out[6:])

        demo.load(_open_link, [session], link_outputs, queue=False, api_name=False)
        # A closed (or reloaded) tab ends its session at once: its training stops, its sets and files are freed
        demo.load(keep_session, [session], None, queue=False, api_name=False, show_progress="hidden")
        demo.unload(close_tab)
        for tab_id, tab in zip(TABS, (tab_explore, tab_compare, tab_tradeoff, tab_train, tab_layers, tab_about)):
            tab.select(lambda t=tab_id: t, None, tab_shown, queue=False, api_name=False, show_progress="hidden")
        # Once the visitor acts, the link's note is stale ("threshold 0.70 ... Press Generate" after a run at 0.5): it goes.
        # `.input` is the visitor's own change, not a link's (which sets these values on load).
        for acted in (go_btn.click, regen_btn.click, prompt.submit, c_btn.click, tr_start.click, t_table.select, threshold.input,
                      router_label.input, kv_policy.input, max_new.input, temperature.input, measure.input):
            acted(link_note_done, None, link_note, queue=False, api_name=False, show_progress="hidden")
        link_btn.click(lambda *values: view_link(res, *values), [prompt, c_prompt, threshold, router_label, kv_policy, max_new, temperature, measure, tab_shown],
                       [link_box, link_note], queue=False, api_name=False).then(None, [link_box], [link_box], js=COPY_LINK_JS, queue=False, api_name=False)
    return demo
