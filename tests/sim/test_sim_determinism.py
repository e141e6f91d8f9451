"""A simulation is a function of its inputs and seed, not of the interpreter's string hashing.

Runs ``milp+jpa`` (noisy measurements drawn per running job) in two interpreters with different
``PYTHONHASHSEED`` and compares every size change. A set of job ids iterated in hash order once
made the noise draws, and so the results, differ between runs with the same seed.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import sys
from malleparsl.jpa.bench import shaped_jobs
from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.sim_setups import SIM_DEFAULTS
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.traces import load_trace

full = load_trace("summit", nodes="0:128")
t0 = full.start_s + 12 * 3600  # the trace's first 12 h leave these nodes busy
specs = shaped_jobs(n_jobs=40, start_s=t0, seed=3, max_nodes=16)
tr = full.window(t0, t0 + 6 * 3600)
adv = JobProfilingAdvisor(**SIM_DEFAULTS)
res = simulate(tr, specs, policy="milp+jpa", options=SimOptions(noise=0.05, seed=1),
               policy_options={"advisor": adv})
print(repr(res.samples), res.rescales)
print(res.sizes.sort_values(["time_s", "job"]).to_csv(index=False))
"""


def _run(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_same_seed_same_result_whatever_the_hash_seed():
    a, b = _run("1"), _run("2")
    assert a.count("\n") > 20, a[:500]  # jobs ran and resized
    assert a == b
