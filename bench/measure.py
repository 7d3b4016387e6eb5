"""Peak RSS of a command, measured right: through a small launcher process.

Linux carries a parent's high-water RSS across fork and exec into the child's ru_maxrss, so a
command forked straight from a large benchmark process (torch imported, gigabytes touched)
reports the benchmark's own peak. A fresh small interpreter starts the command instead, and
reports RUSAGE_CHILDREN of its only child: the launcher is a few MiB, below any command measured.
"""
import os
import subprocess
import sys

_LAUNCHER = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "sys.stderr.buffer.write(r.stderr[-4000:])\n"
    "sys.stderr.write('\\nRSS_KIB %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(r.returncode)\n")


def peak_rss(cmd, env=None):
    """Peak RSS in bytes of one run of `cmd` (a list), which must succeed."""
    r = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *map(str, cmd)],
                       capture_output=True, text=True, env=env or os.environ)
    head, _, tail = r.stderr.rpartition("\nRSS_KIB ")
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{head}")
    return int(tail.strip()) * 1024
