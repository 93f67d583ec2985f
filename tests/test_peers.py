"""bench/peers.py: a peer runs in a child process; its crash is named with its signal and costs the benchmark only
that peer's figures (`bench speed` completes)."""

import math

import pytest

import fake_peers
from routerlab.bench import speed
from routerlab.bench.peers import InChild, PeerCrashed


def test_a_peer_in_its_child_answers_its_calls():
    peer = InChild(fake_peers.Steady, name="steady")
    try:
        assert peer.version == "steady-1" and peer.path.name == "steady.gguf"
        assert peer.decode_rate([1, 2, 3], 4) == 43.0 and peer.ttft([1]) == 0.25
    finally:
        peer.close()
    assert not peer._proc.is_alive()


def test_a_segfault_in_the_peer_is_named_and_the_parent_goes_on():
    peer = InChild(fake_peers.Segfaults, name="llama.cpp")
    with pytest.raises(PeerCrashed, match="llama.cpp crashed during decode_rate: its process was killed by SIGSEGV"):
        peer.decode_rate([1, 2], 3)
    with pytest.raises(PeerCrashed, match="not running"):
        peer.ttft([1])
    peer.close()


def test_a_peer_that_cannot_start_says_why():
    with pytest.raises(PeerCrashed, match="failed during start: RuntimeError: no such model file"):
        InChild(fake_peers.FailsToStart, name="llama.cpp")


def test_bench_speed_completes_when_its_peer_crashes(embedded, monkeypatch):
    logged = []
    monkeypatch.setattr(speed, "_llama_cpp", lambda loaded, context, log: speed._Survivor(InChild(fake_peers.Segfaults), log))
    r = speed.speed_benchmark(prompt_tokens=24, new_tokens=4, rounds=1, loaded=embedded, long_context=0, ttft_tokens=0,
                              peers=True, log=logged.append)
    assert "SIGSEGV" in r["llama_cpp_error"] and r["tokens_per_second"]["llama_cpp"] is None
    assert r["engine_vs_llama_cpp"] is None and math.isfinite(r["engine_vs_generate"]) and r["tokens_per_second"]["engine"] > 0
    assert any("SIGSEGV" in line and "goes on without it" in line for line in logged)
    text = speed.format_speed(r)
    assert "llama.cpp: llama.cpp crashed during decode_rate: its process was killed by SIGSEGV" in text


def test_the_rebuild_flags_follow_the_cpu_and_never_take_the_native_or_amx_path():
    from routerlab.bench.peers import cmake_args, cpu_flags

    flags = cpu_flags("processor : 0\nflags\t\t: fpu sse avx avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile\n")
    args = cmake_args(flags).split()
    assert args[0] == "-DGGML_NATIVE=OFF" and "-DGGML_AVX512=ON" in args and "-DGGML_AVX512_BF16=ON" in args
    assert "-DGGML_AVX512_VBMI=OFF" in args and not any("AMX" in a for a in args)
    assert "-DGGML_AVX512=OFF" in cmake_args(cpu_flags("flags : avx avx2 fma\n")).split()
    assert cpu_flags("") == set()
