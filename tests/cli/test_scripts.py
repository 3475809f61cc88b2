"""The scripts a user runs refuse what would lose data or say nothing: history_series.py never
deletes a folder it did not make (nor a checkout), repro.py never writes outside its -o and says
when it ran or read nothing, wall_profile.py exits non-zero when a profiled command failed."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def script(name: str, *args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    g = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "k.py").write_text("BLOCK = 64\n")
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "c"], check=True)
    return repo, subprocess.run(g + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_history_series_deletes_only_an_earlier_series(tmp_path):
    repo, head = _repo(tmp_path)
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "committed.json").write_text("{}")
    r = script("history_series.py", "--repo", repo, "--out", mine, head)
    assert r.returncode == 2 and "is not an earlier series" in r.stderr and "Traceback" not in r.stderr
    assert (mine / "committed.json").is_file()
    for out in (repo, tmp_path):  # the checkout, a folder that holds it: never, even with --force
        r = script("history_series.py", "--repo", repo, "--out", out, "--force", head)
        assert r.returncode == 2 and "never deleted" in r.stderr, r.stderr
        assert (repo / ".git").is_dir() and (repo / "k.py").is_file()
    series = tmp_path / "series"
    assert script("history_series.py", "--repo", repo, "--out", series, head).returncode == 0
    assert script("history_series.py", "--repo", repo, "--out", series, head).returncode == 0  # its own: remade
    r = script("history_series.py", "--repo", repo, "--out", mine, "--force", head)
    assert r.returncode == 0 and not (mine / "committed.json").exists()


@pytest.fixture(scope="module")
def repro():
    spec = importlib.util.spec_from_file_location("repro", SCRIPTS / "repro.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["repro"] = mod  # a dataclass looks its module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("repro", None)


def test_repro_calibrate_never_writes_outside_its_folder(tmp_path, repro, capsys):
    """A run whose provenance.sweep is `../victim` would have been written to OUT/../victim.json."""
    runs = tmp_path / "runs"
    runs.mkdir()
    doc = json.loads((ROOT / "results" / "h200" / "count-block.json").read_text())
    doc["provenance"]["sweep"] = "../victim"
    for k in (1, 2):
        (runs / f"x-run{k}.json").write_text(json.dumps(doc))
    victim = tmp_path / "victim.json"
    victim.write_text("precious\n")
    out = tmp_path / "models"
    assert repro.main(["calibrate", str(runs), "-o", str(out)]) == 2
    assert "cannot name a model file" in capsys.readouterr().err
    assert victim.read_text() == "precious\n" and not out.exists()


def test_repro_refuses_to_run_nothing_and_a_noise_model_that_is_no_folder(tmp_path, repro, capsys):
    assert repro.main(["run", "--sweeps", "", "--out", str(tmp_path / "r")]) == 2
    assert "--sweeps: expected a comma list" in capsys.readouterr().err and not (tmp_path / "r").exists()
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(ROOT / "results" / "h200" / "count-block.json", runs / "count-block-run1.json")
    assert repro.main(["report", str(runs), "--noise", "/etc/passwd", "-o", str(tmp_path / "r.md")]) == 2
    assert "--noise: /etc/passwd is not a folder" in capsys.readouterr().err


def test_wall_profile_exits_non_zero_when_a_command_fails(tmp_path):
    r = script("wall_profile.py", tmp_path / "w", "sweep 'count-block")
    assert r.returncode == 2 and "cannot split" in r.stderr and "Traceback" not in r.stderr
    r = script("wall_profile.py", tmp_path / "w", "validate no-such-spec.yaml")
    assert r.returncode == 1 and "exited 2" in r.stderr, r.stderr
    assert (tmp_path / "w" / "wall_profile.md").is_file()  # the failed command's row is still written
