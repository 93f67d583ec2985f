"""docs/results.md's "On each machine kind" table: every committed speed*.json side by side, one row per machine kind."""

from __future__ import annotations

from pathlib import Path

from routerlab.bench.results.report_cells import READ_ERRORS, _num, _read


def speed_kinds_markdown(folder: Path) -> list[str]:
    """The headline figures of every `speed*.json` in `folder` side by side, one row per machine kind (`make bench` on
    each kind of CPU met: kept as speed-<kind>.json beside speed.json). Nothing when there is only one."""
    rows = []
    for path in sorted(Path(folder).glob("speed*.json")):
        try:
            r = _read(path)
            lc, ttft = r.get("long_context") or {}, r.get("ttft_seconds") or {}
            kind = r.get("machine_kind") or str(r.get("cpu", "?")).lower()
            flags = " ".join(r.get("cpu_flags") or []) or f"vector unit {r.get('cpu', '?')}"
            rows.append(f"| `{path.name}` | {r.get('cpu_model', '?')}, {r['threads']} threads, {r['rounds']} rounds; **{kind}** ({flags}) "
                        f"| {r['tokens_per_second']['engine']:.1f} | {_num(r['tokens_per_second'].get('llama_cpp'), 1)} "
                        f"| {_num(r.get('engine_vs_llama_cpp'))} | {_num(lc.get('engine_vs_llama_cpp'))} "
                        f"| {_num(ttft.get('engine'), 2)} / {_num(ttft.get('generate'), 2)} s | {_num(r.get('routing'))} "
                        f"| {_num(r.get('kernel_floor_vs_llama_cpp'))} | {_onnxruntime(r)} | {_decode(r)} |")
        except (OSError, *READ_ERRORS) as err:
            rows.append(f"| `{path.name}` | could not be read ({type(err).__name__}) | | | | | | | | | |")
    if len(rows) < 2:
        return []
    return ["### On each machine kind", "",
            "Every `speed*.json` here, each from `make bench` (or `python -m routerlab bench speed --save assets/bench/speed-KIND.json`) on the machine "
            "it names, 512-token prompt unless its section says otherwise: engine and llama.cpp tokens/s, their ratio at "
            "512 and at 2,048 tokens of context, time to first token of a 2,048-token prompt (engine / transformers "
            "`generate`), never-skip routing against the full model, and the kernel floor (products, attention and head "
            "alone) against llama.cpp's whole step, and the maps whose one-row products went through onnxruntime "
            "(core/kernels/low_paths.py measures that at start-up; \"-\": a result from before it did), and the decode path measured "
            "faster at start-up (core/decode/decode_paths.py: torch's ops, or one onnxruntime graph a step).", "",
            "| file | machine | engine tok/s | llama.cpp tok/s | engine vs llama.cpp | at 2,048 | first token, 2,048 | never-skip | kernel floor vs llama.cpp | through onnxruntime | decode path |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _decode(r: dict) -> str:
    """The decode path a result's engine took: "torch's ops", "step graph", "-" where it predates the choice."""
    decode = (r.get("decode") or {}).get("decode")
    return {"graph": "step graph", "torch": "torch's ops"}.get(decode, "-")


def _onnxruntime(r: dict) -> str:
    """The kinds of map a result's engine multiplied through onnxruntime: "none", "-" where it predates the choice."""
    kernels = r.get("kernels")
    if not kernels:
        return "-"
    return ", ".join(kernels.get("onnxruntime") or []) or "none"
