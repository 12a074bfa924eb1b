"""Build and install llama-cpp-python for the machine it will run on (called by scripts/setup.sh).

Why not pip's default build: llama.cpp's default is ``-march=native``, i.e. every instruction
set the CPU *advertises*.  On some virtual machines the CPU advertises more than the operating
system enabled (AMX listed in /proc/cpuinfo, tile state not enabled by the hypervisor), and the
native build dies with SIGILL.  ggml's runtime-dispatched CPU variants (``GGML_CPU_ALL_VARIANTS``)
do not help: they choose a variant from CPUID bits alone, without asking the OS (no XGETBV /
``arch_prctl`` check), so they pick the AMX variant on exactly that machine.

What this does instead, chosen by ``VERISPEC_LLAMA_BUILD``:

``probe`` (default)
    Compile ``scripts/cpu_probe.c`` and *execute* one instruction of each instruction set in its
    own process; build with ``GGML_NATIVE=OFF`` and only the sets whose instruction ran.  As fast
    as native wherever native works (same instruction sets), and safe where it does not.
``portable``
    No optional instruction set at all: the x86-64 (SSE2) or armv8-a (NEON) baseline.  Runs on any
    x86-64 / aarch64 Linux machine; slower (no SIMD beyond SSE2 / NEON).  The escape hatch if a probe ever lies.
``native``
    llama.cpp's own default (``GGML_NATIVE=ON``): whatever the compiler detects.

The wheel is built once per (llama-cpp-python version, CMake flags, machine, compiler, Python) and
kept in ``$VERISPEC_CACHE/wheels`` (default ``~/.cache/verispec/wheels``); pip's own wheel cache is
bypassed because it keys a source build by the source archive alone, so a wheel built for one CPU
would be reused on another.  A marker in the virtual environment records what is installed, so a
re-run with nothing changed does nothing.

Usage: ``python scripts/build_llama.py`` (with the target environment's interpreter).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = os.environ.get("VERISPEC_LLAMA_CPP_PYTHON_VERSION", "0.3.36")
MODES = ("probe", "portable", "native")
HERE = Path(__file__).resolve().parent

#: instruction set probed by cpu_probe.c -> the ggml CMake option it enables (x86-64).
X86_FEATURES = {
    "sse42": "GGML_SSE42",
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512": "GGML_AVX512",
    "avx512_vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
AARCH64_FEATURES = ("dotprod", "fp16", "i8mm")  # appended to -march=armv8.2-a as +feature


def log(msg: str) -> None:
    print(f"[build_llama] {msg}", flush=True)


def probe_features(candidates) -> list[str]:
    """The instruction sets among ``candidates`` that this machine executes (each tried in a child)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("build_llama: no C compiler (cc/gcc) found; it is needed to build llama.cpp anyway: "
                         "install gcc (Debian: apt-get install build-essential)")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "cpu_probe"
        subprocess.run([cc, "-O0", "-o", str(exe), str(HERE / "cpu_probe.c")], check=True)
        ok = []
        for feature in candidates:
            rc = subprocess.run([str(exe), feature], stderr=subprocess.DEVNULL).returncode
            if rc == 0:
                ok.append(feature)
            elif rc < 0 or rc == 2:  # killed by a signal (SIGILL), or refused by the OS (AMX)
                pass
            else:
                raise SystemExit(f"build_llama: cpu_probe {feature} exited with {rc}: probe and script disagree")
        return ok


def cmake_args(mode: str, machine: str) -> tuple[list[str], list[str]]:
    """(CMake arguments, instruction sets they enable) for ``mode`` on ``machine``."""
    if mode == "native":
        return ["-DGGML_NATIVE=ON"], ["native"]
    x86 = machine in ("x86_64", "amd64")
    if not x86 and machine not in ("aarch64", "arm64"):
        raise SystemExit(f"build_llama: unsupported machine {machine!r}; set VERISPEC_LLAMA_BUILD=native "
                         "to let llama.cpp detect it")
    args = ["-DGGML_NATIVE=OFF"]
    if x86:
        found = probe_features(X86_FEATURES) if mode == "probe" else []
        args += [f"-D{opt}={'ON' if f in found else 'OFF'}" for f, opt in X86_FEATURES.items()]
        args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]  # see the module docstring
        return args, found
    found = probe_features(AARCH64_FEATURES) if mode == "probe" else []
    arch = "armv8.2-a" + "".join(f"+{f}" for f in found) if found else "armv8-a"
    return args + [f"-DGGML_CPU_ARM_ARCH={arch}"], found


def build_key(args: list[str], machine: str) -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or "cc"
    cc_version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    ident = json.dumps([LLAMA_CPP_PYTHON_VERSION, args, machine, cc_version, sysconfig.get_platform(),
                        sys.implementation.cache_tag])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def main() -> int:
    mode = os.environ.get("VERISPEC_LLAMA_BUILD", "probe").strip().lower() or "probe"
    if mode not in MODES:
        raise SystemExit(f"build_llama: VERISPEC_LLAMA_BUILD={mode!r} is not one of {', '.join(MODES)}")
    machine = platform.machine().lower()
    args, found = cmake_args(mode, machine)
    key = build_key(args, machine)
    record = {"mode": mode, "machine": machine, "features": found, "cmake_args": args, "key": key,
              "version": LLAMA_CPP_PYTHON_VERSION}
    marker = Path(sys.prefix) / "share" / "verispec" / "llama-build.json"
    installed = json.loads(marker.read_text()) if marker.is_file() else None
    if installed and installed.get("key") == key and _llama_installed():
        log(f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({mode}: {' '.join(found) or 'baseline'}) already installed")
        return 0
    cache = Path(os.environ.get("VERISPEC_CACHE") or Path.home() / ".cache" / "verispec") / "wheels" / key
    wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    if not wheels:
        log(f"building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({mode}: {' '.join(found) or 'baseline'}); "
            "this takes 3-8 minutes")
        log("CMAKE_ARGS=" + " ".join(args))
        env = dict(os.environ, CMAKE_ARGS=" ".join(args),
                   CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2)))
        tmp = cache.with_name(cache.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
                        "--no-cache-dir", "--no-binary", "llama-cpp-python", "-w", str(tmp),
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True, env=env)
        (tmp / "build.json").write_text(json.dumps(record, indent=1))
        tmp.rename(cache)  # only a finished build becomes visible
        wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    else:
        log(f"using the cached build {wheels[-1]}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    "--force-reinstall", "--no-deps", str(wheels[-1])], check=True)
    # its own (pure-Python) requirements, without touching anything already satisfied
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    str(wheels[-1])], check=True)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(record, indent=1))
    log(f"installed llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({mode}: {' '.join(found) or 'baseline'})")
    return 0


def _llama_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python") == LLAMA_CPP_PYTHON_VERSION
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
