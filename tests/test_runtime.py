"""Process tuning (verispec.runtime): glibc keeps vocabulary-sized rows instead of faulting them in anew."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from verispec.runtime import tune_malloc

# The allocation pattern of an SD step (γ = 5, 151,936 tokens): five draft rows kept, a block of six
# target rows, temporaries of the block's size made and freed, then everything freed.
_STEPS = """
import resource, sys
import numpy as np
from verispec.runtime import tune_malloc
tuned = tune_malloc() if sys.argv[1] == "tune" else False
V = 151_936
def step():
    kept = [np.ones(V, np.float32) for _ in range(5)]
    block = np.ones((6, V), np.float32)
    for _ in range(3):
        tmp = np.exp(block)
        tmp2 = tmp * 2
        del tmp, tmp2
    return kept + [block]
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    step()
print(tuned, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 30)
"""


def _faults_per_step(mode: str) -> tuple[bool, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0].startswith("glibc"),
                    reason="mallopt thresholds are glibc's")
def test_tuned_allocator_stops_the_page_faults_of_an_sd_step():
    tuned, faults = _faults_per_step("tune")
    untuned, default_faults = _faults_per_step("default")   # glibc's own (dynamic) thresholds
    assert tuned and not untuned
    assert default_faults > 1000        # blocks unmapped or trimmed, then faulted in again
    assert faults < default_faults / 20, (faults, default_faults)


def test_user_settings_win(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert tune_malloc() is False
