"""Bad values that crashed past the option parsing (issue 24): each is one line, exit 2, no traceback."""

import os

import pytest

from clirun import run_cli, small_count_spec


def _one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("limit", ["1e10", "inf", "nan", "-1"])
def test_case_limit_out_of_range_is_a_usage_error(tmp_path, capsys, limit):
    spec = tmp_path / "s.yaml"
    spec.write_text(small_count_spec("s"))
    code, _, err = run_cli(["sweep", str(spec), "--case-limit", limit, "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and _one_line(err) and "--case-limit" in err and "1e+06" in err, err
    assert not (tmp_path / "r").exists()  # refused before anything ran


@pytest.mark.parametrize("name", ["s.md", "s.partial.jsonl"])
def test_a_folder_where_a_results_file_goes_is_refused_before_any_case_runs(tmp_path, capsys, name):
    """It was found after every case had run, when the results were written."""
    spec = tmp_path / "s.yaml"
    spec.write_text(small_count_spec("s"))
    (tmp_path / "r" / "cpu-interpreter" / name).mkdir(parents=True)
    code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and _one_line(err) and f"cpu-interpreter/{name} is a folder, where this run writes a file" in err
    assert sorted(p.name for p in (tmp_path / "r" / "cpu-interpreter").iterdir()) == [name]  # nothing ran


def test_a_long_sweep_name_is_refused_naming_the_key(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(small_count_spec("n" * 300))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    assert code == 2 and _one_line(err) and f"{spec}: name: expected at most 100 characters" in err, err
    spec.write_text(small_count_spec("n" * 100))
    assert run_cli(["validate", str(spec)], capsys)[0] == 0


@pytest.mark.parametrize("command", [["render"], ["merge"], ["show"], ["recommend"], ["compare", "other.json"]])
def test_a_symlink_loop_is_one_line(tmp_path, capsys, command):
    loop = tmp_path / "loop.json"
    os.symlink(loop.name, loop)
    args = [command[0], str(loop)] + [str(tmp_path / a) for a in command[1:]]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and _one_line(err) and "loop.json" in err, err
