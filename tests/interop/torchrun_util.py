"""The torchrun runs of the save scripts (dcp_make.py, layouts_make.py, megatron_make.py).

A module of its own, not helpers.py: tests/python imports these scripts too, and has a helpers.py
of its own.
"""

import os
import shutil
import subprocess

def run_ranks(cmd, out, made=None, timeout=900):
    """Runs `cmd`, a torchrun of ranks (gloo, OMP_NUM_THREADS=1) that save into the folder `out`.
    gloo on a loaded 2-core machine now and then aborts one rank at teardown ("terminate called
    without an active exception", exit -6) after the saves: a torch flake, so the saves are made
    again from scratch, up to three times, and a third failure fails. `made`: the names under
    `out` that `cmd` writes, removed before a retry (None: everything in `out`)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(3):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0:
            return
        for name in os.listdir(out) if made is None else made:
            p = os.path.join(out, name)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)
    raise AssertionError(f"{cmd} exited {r.returncode}:\n{r.stderr[-3000:]}")

