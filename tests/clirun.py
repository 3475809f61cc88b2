"""Run the moebench CLI in process, as the tests do."""

import os
import sys

from moebench import cli


def run_cli(args, capsys):
    """`moebench ARGS` in process. COLUMNS is pinned wide: rich wraps at the console width (80 in a
    pipe), and the one-line messages here should read as one line."""
    old, cols = sys.argv, os.environ.get("COLUMNS")
    sys.argv = ["moebench", *args]
    os.environ["COLUMNS"] = "2000"
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old
        if cols is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = cols
    cap = capsys.readouterr()
    return code, cap.out, cap.err
