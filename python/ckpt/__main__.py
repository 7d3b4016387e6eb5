"""`python -m ckpt ARGS` and the `ckpt` console script: the ckpt command-line tool.

The tool is a C++ program installed inside this package (ckpt/_bin/ckpt: the wheel's CMake
component "python"). main() replaces this process with it (exec), so its exit status, signals
(Ctrl-C removes its temporaries, docs/cli.md) and standard streams are the tool's own."""

import os
import signal
import sys


def binary():
    """The path of the bundled ckpt program."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ckpt")


def main(argv=None):
    exe = binary()
    args = sys.argv[1:] if argv is None else list(argv)
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"ckpt: the command-line tool is not part of this installation ({exe} "
                         "is missing): install the package with pip (pip install .), or run "
                         "the ckpt program of a CMake build\n")
        return 127
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: give
    # the tool the defaults a shell would (`ckpt ls big.pt | head` ends quietly).
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["ckpt", *args])


if __name__ == "__main__":
    sys.exit(main())
