"""`python3 -m moebench`: the command line, wherever it is started from.

On a fresh machine the first Python at hand usually lacks the dependencies. Then, inside a checkout
whose `.venv` exists (`make install`, `make sweep` or `make test` made it), the command runs again
with that venv's Python; without one it says in one line what to run, and exits 2 (a usage error),
instead of a bare ImportError traceback. Written for any Python 3, so even an old interpreter gets
the line rather than a syntax error.
"""

# Before any other import: SIGTERM/Ctrl-C exit 143/130 from here on (moebench.startup says why).
from moebench.startup import exit_on_signals

exit_on_signals()

import importlib.util
import os
import sys

# What the command line itself imports; torch and triton are checked when kernels are about to run.
NEEDED = ("typer", "rich", "yaml", "pandas")
# Set before re-running under the venv: if the venv lacks them too, say so instead of looping.
RELAUNCHED = "MOEBENCH_RELAUNCHED"


def _launch():
    missing = [] if sys.version_info >= (3, 11) else ["Python >= 3.11"]
    if not missing:
        missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        from moebench.cli import entry

        entry()
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(root, ".venv")
    venv_python = os.path.join(venv, "bin", "python")
    inside = os.path.realpath(sys.prefix) == os.path.realpath(venv)
    if os.path.exists(venv_python) and not inside and not os.environ.get(RELAUNCHED):
        os.environ[RELAUNCHED] = "1"
        os.execv(venv_python, [venv_python, "-m", "moebench"] + sys.argv[1:])
    sys.stderr.write("moebench: this Python (%s) lacks %s; run `make sweep` in %s (it sets up .venv and runs "
                     "count-block), or `make install` and then `python3 -m moebench ...` again\n"
                     % (sys.executable, ", ".join(missing), root))
    sys.exit(2)


_launch()
