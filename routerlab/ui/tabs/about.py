"""The About tab's text: how a router decides, the KV policies, what each number measures, a diagram.

Owns `ABOUT_MD` (Markdown; the KV policy lines come from `core.base.config.KV_POLICY_HELP`) and
`DIAGRAM` (inline SVG, no network). Knows nothing else: no handlers, no state.
"""

from routerlab.core.base.config import KV_POLICY_HELP

ABOUT_MD_TEMPLATE = """
### What you are looking at
A **router** is one tiny linear layer in front of a sub-layer (here: attention). For every token it
reads the normalised hidden state and outputs a score `sigmoid(w · x)`. The sub-layer runs only if
**score ≥ threshold**; otherwise the token goes straight on through the residual connection.
In **Router-Tuning** only these routers are trained (about 1,000 instructions, one epoch), the base
model stays frozen. Fresh routers output 0.5 everywhere, so at threshold 0.5 nothing is skipped.

### Train your own routers (Train tab)
Only the routers learn; the model is frozen. They start from a quick fit of how much each layer changes each token (or
from zero, as in the paper), and a few minutes on the built-in prompts or your own text give a set that skips what you
asked for; its curves show the distillation loss (how far the routed model's predictions are from the full
model's, what it learns from), the LM loss and how much it skips. Held-out text, never trained on, checks it during training and at the end,
against the shipped routers and random skipping. The set is yours alone in this browser tab: download it as a zip to
keep it (it carries a Hugging Face model card), upload the zip to bring it back.

### A room at once: what skipping saves when visitors share a step
Everyone's generations decode in one loop: each step runs one token of every running generation through the model
together, each with its own routers, threshold and KV policy (the status line says how many share your step). A
layer's weights are then read once for the whole room, and each visitor pays only for their own share of the work:
a token that skips attention saves its own queries, its attention over its cache and its share of the projections,
but the weights are still read for the tokens that run it. Only a layer that every token of the step skips is not
computed at all. On the 2-core machine of `make room` (AMD EPYC, AVX2), the engine's step of 8 tokens took about 2.6 times one
token's (54 against 21 ms; the weights' products alone 39 against 15 ms), so it decodes about 3 times as many
tokens per second for 8 visitors as for one. Served to 8 pages on those same 2 cores, with their quality measured,
the room shared about 51 tokens/s among them; what it buys most is waiting: 32 visitors at once were all served,
the first token within 5.4 s for 95% of them, where one generation at a time turned 14 of 32 away.

### Teaching with it
`docs/workshop.md` is a 75-minute lesson in eight exercises, each with a link that opens this page in its settings
(**Copy link to this view**, left, makes one for what you see). The first three, on this server:
[what a router decides](?tab=explore&routers=attention-token&threshold=0.5&kv=kv&max_new_tokens=96&quality=on) ·
[the threshold at 0.7](?tab=explore&routers=attention-token&threshold=0.7&kv=kv&max_new_tokens=96&quality=on) ·
[the threshold ladder](?tab=compare&routers=attention-token&threshold=0.5&kv=kv&max_new_tokens=96&quality=on).
`python -m routerlab figures --out DIR` writes its figures for slides; `docs/workshop.ipynb` is the same lesson in code.

### Where skipping pays: long contexts
In a model this small, at a short prompt, a decode step's time goes mostly to reading the MLP and output weights, and
skipping a share of attention saves little time. Attention reads every cached token, so its share grows with the
context: at a long document (pick one under *Long document*: 1,600-2,100 tokens with a task) the same skipped share
removes more of each step, and `drop`, which also leaves skipped tokens out of later tokens' caches, gains most. The
Trade-off tab's last figure, *Where skipping pays*, is that speedup measured against context length (`make context`),
its ideal beside it and the quality cost at each point; the estimated speedup in Explore costs each token at its own
context. A long prompt is read in chunks: the status line counts its tokens, and Stop works while it is read.

### Three ways to skip attention with a KV cache
{kv_policies}

### What is measured, and how
* **Heatmap**: one column per token (prompt, then generated), one row per layer. Warm colours: the layer ran, coloured by router score; greys: skipped; blank rows: layers without a router (they always run). Dashed blue lines: where you moved the threshold during the run.
* **Quality strip** (under the heatmap's generated columns) and the text's underline: each token's KL divergence from the full model's next-token distribution to the routed model's, in nats, measured by a full-depth pass over the run's own tokens (grey: not measured yet; hover for the KL and both models' top tokens). The stats give the mean KL and how often both models' top token agree. Switch it off with *Measure quality*.
* **tokens/s (measured)**: wall time of each decode step on this machine, measured in the engine (the UI's drawing is not included; the quality pass is).
* **est. speedup**: an *estimate*, not a measurement: the full model's decode step and the cost of each skipped sub-layer are timed on this machine at start-up, and the skipped work is taken away (routing's own small cost is not counted). Compare measures speeds side by side.
* **attention FLOPs saved**: share of the attention work (projections + scores) not computed for routed layers, from the model's shapes and the recorded decisions.
* **KV cache saved**: keys/values never stored (only the *drop* policy saves memory).
* **What-if**: after a run, moving the slider re-decides every cell from the recorded scores (cells whose decision changes are tinted blue). Nothing is re-run: tokens after the first changed decision could have been different. Use *Regenerate at this threshold* for the true run.
* Exports: the trace as JSON (every token's scores and decisions), the heatmap as a standalone HTML page; the camera icon on any plot saves a PNG.
"""

ABOUT_MD = ABOUT_MD_TEMPLATE.replace("{kv_policies}", "\n".join(f"* **{name}**: {text}." for name, text in KV_POLICY_HELP.items()))

DIAGRAM = """
<svg viewBox="0 0 800 190" class="rl-diagram" role="img" aria-label="A router scores each token; attention runs only if the score clears the threshold">
 <defs><marker id="rl-arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#374151"/></marker></defs>
 <g font-family="system-ui,sans-serif" font-size="13" fill="#111827" stroke-width="1.5">
  <rect x="10" y="90" width="80" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="50" y="113" text-anchor="middle">token h</text>
  <rect x="120" y="90" width="70" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="155" y="113" text-anchor="middle">norm</text>
  <rect x="220" y="90" width="120" height="36" rx="6" fill="#fde68a" stroke="#d97706"/><text x="280" y="113" text-anchor="middle">router σ(w·x)</text>
  <rect x="370" y="90" width="130" height="36" rx="18" fill="#fff" stroke="#374151"/><text x="435" y="113" text-anchor="middle">score ≥ threshold?</text>
  <rect x="540" y="90" width="100" height="36" rx="6" fill="#fecaca" stroke="#b23a48"/><text x="590" y="113" text-anchor="middle">attention</text>
  <circle cx="690" cy="108" r="16" fill="#fff" stroke="#374151"/><text x="690" y="113" text-anchor="middle">+</text>
  <rect x="725" y="90" width="65" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="757" y="113" text-anchor="middle">h′</text>
  <g stroke="#374151" fill="none">
   <path d="M90,108 H116" marker-end="url(#rl-arrow)"/>
   <path d="M190,108 H216" marker-end="url(#rl-arrow)"/>
   <path d="M340,108 H366" marker-end="url(#rl-arrow)"/>
   <path d="M500,108 H536" marker-end="url(#rl-arrow)"/>
   <path d="M640,108 H670" marker-end="url(#rl-arrow)"/>
   <path d="M706,108 H721" marker-end="url(#rl-arrow)"/>
   <path d="M50,90 V40 H690 V88" stroke="#9ca3af" marker-end="url(#rl-arrow)"/>
   <path d="M435,126 V165 H690 V128" stroke="#d97706" stroke-dasharray="5 4" marker-end="url(#rl-arrow)"/>
  </g>
  <text x="518" y="102" font-size="11" fill="#374151" text-anchor="middle">yes</text>
  <text x="370" y="34" font-size="11" fill="#6b7280">residual: h always passes on</text>
  <text x="445" y="160" font-size="11" fill="#92400e">no: skip (the KV policy decides what is still computed)</text>
 </g>
</svg>
"""
