"""The set-up's llama.cpp build choice (scripts/build_llama.py, scripts/cpu_probe.c) and smoke step."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build_llama = _load("build_llama")
smoke = _load("smoke")
x86 = platform.machine().lower() in ("x86_64", "amd64")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


def _cpuinfo_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(("flags", "Features")))
    return set(line.split(":", 1)[1].split())


#: probe name -> the /proc/cpuinfo flags a CPU must list for that instruction to be legal.
ADVERTISED = {
    "sse42": {"sse4_2"}, "avx": {"avx"}, "avx2": {"avx2"}, "fma": {"fma"}, "f16c": {"f16c"}, "bmi2": {"bmi2"},
    "avx_vnni": {"avx_vnni"}, "avx512": {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"},
    "avx512_vbmi": {"avx512vbmi"}, "avx512_vnni": {"avx512_vnni"}, "avx512_bf16": {"avx512_bf16"},
}


@needs_cc
@pytest.mark.skipif(not x86, reason="x86-64 instruction sets")
def test_probe_finds_only_advertised_instruction_sets_and_the_baseline():
    found = build_llama.probe_features(list(ADVERTISED) + ["amx"])
    flags = _cpuinfo_flags()
    for feature in found:
        if feature != "amx":
            assert ADVERTISED[feature] <= flags, f"{feature} executed but /proc/cpuinfo does not list it"
    assert "sse42" in found  # every x86-64 CPU of the last 15 years; a probe that finds nothing is broken
    # The reverse need not hold (that is the point: advertised is not enabled), but where the kernel
    # lists no AVX at all, the AVX probe must have died.
    if "avx" not in flags:
        assert "avx" not in found


@needs_cc
def test_probe_rejects_an_unknown_feature(tmp_path):
    exe = tmp_path / "cpu_probe"
    subprocess.run([shutil.which("cc") or "gcc", "-O0", "-o", str(exe), str(SCRIPTS / "cpu_probe.c")], check=True)
    assert subprocess.run([str(exe), "no_such_feature"]).returncode == 3
    assert subprocess.run([str(exe)], stderr=subprocess.DEVNULL).returncode == 64


@pytest.mark.skipif(not x86, reason="x86-64 flag mapping")
def test_portable_build_enables_no_optional_instruction_set(monkeypatch):
    args, found = build_llama.cmake_args("portable", "x86_64")
    assert found == [] and "-DGGML_NATIVE=OFF" in args
    assert not [a for a in args if a.endswith("=ON")]
    assert {f"-D{opt}=OFF" for opt in build_llama.X86_FEATURES.values()} <= set(args)


def test_probe_build_enables_exactly_what_ran(monkeypatch):
    monkeypatch.setattr(build_llama, "probe_features", lambda cands: [c for c in cands if c in ("avx", "avx2")])
    args, found = build_llama.cmake_args("probe", "x86_64")
    assert found == ["avx", "avx2"]
    on = {a for a in args if a.endswith("=ON")}
    assert on == {"-DGGML_AVX=ON", "-DGGML_AVX2=ON"}
    assert "-DGGML_AMX_TILE=OFF" in args and "-DGGML_NATIVE=OFF" in args
    args, found = build_llama.cmake_args("probe", "aarch64")
    assert args == ["-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv8-a"] and found == []


def test_build_key_depends_on_the_flags():
    a, _ = build_llama.cmake_args("portable", "x86_64")
    assert build_llama.build_key(a, "x86_64") != build_llama.build_key(a + ["-DGGML_AVX=ON"], "x86_64")
    assert build_llama.build_key(a, "x86_64") == build_llama.build_key(list(a), "x86_64")


def test_unknown_build_mode_is_refused(monkeypatch):
    monkeypatch.setenv("VERISPEC_LLAMA_BUILD", "fastest")
    with pytest.raises(SystemExit, match="not one of probe, portable, native"):
        build_llama.main()


def test_smoke_turns_sigill_into_the_cause_and_the_fix():
    msg = smoke.explain_signal(signal.SIGILL, {"mode": "native", "features": ["native"]})
    assert "SIGILL" in msg and "illegal instruction" in msg
    assert "VERISPEC_LLAMA_BUILD=portable bash scripts/setup.sh" in msg
    other = smoke.explain_signal(signal.SIGSEGV, {})
    assert "SIGSEGV" in other and "VERISPEC_LLAMA_BUILD=portable" in other


def test_smoke_reports_a_child_killed_by_sigill(capsys):
    import sys

    dies = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
    assert smoke.main(dies) == 1
    err = capsys.readouterr().err
    assert "SIGILL" in err and "VERISPEC_LLAMA_BUILD=portable bash scripts/setup.sh" in err
    fails = [sys.executable, "-c", "import sys; sys.exit('model file missing')"]
    assert smoke.main(fails) == 1
    assert "exit status 1" in capsys.readouterr().err
