"""The CLI stays thin: parse -> call the library -> render. No function in moebench/cli/ runs over
60 lines (decorators and signature included), counted from the source with ast."""

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "moebench" / "cli"
LIMIT = 60


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([n.lineno] + [d.lineno for d in n.decorator_list])
            span = n.end_lineno - first + 1
            if span > limit:
                out.append((n.name, span))
    return out


def test_the_counter_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"@dec\ndef f():\n{body}\n") == [("f", LIMIT + 2)]
    assert long_functions("def g():\n    return 1\n") == []


def test_no_cli_function_over_60_lines():
    files = sorted(CLI.glob("*.py"))
    assert len(files) >= 5
    found = [f"{f.name}:{name} ({n} lines)" for f in files for name, n in long_functions(f.read_text())]
    assert not found, "CLI functions over 60 lines: " + ", ".join(found)


def test_a_sweep_checks_the_kill_switches_once(tmp_path, capsys, monkeypatch):
    """`verify` hands the environment to the run driver, which checks it before the first case; the
    CLI does not check it again."""
    import moebench.core.driver as driver
    import moebench.core.pipeline as pipeline
    from clirun import run_cli

    calls = []
    real = pipeline.check_environment

    def counting(*args, **kw):
        calls.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(pipeline, "check_environment", counting)
    monkeypatch.setattr(driver, "check_environment", counting)
    code, _, err = run_cli(["verify", "count-block", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert len(calls) == 1 and len(calls[0]) > 1
