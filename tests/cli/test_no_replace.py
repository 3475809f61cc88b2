"""Nothing replaced without --force, and nothing kept that no longer holds: plot's default output,
a page of other content, another spec of the same name, a plugin edited between runs."""

import json
import os
import shutil
from pathlib import Path
import warm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
DEV = "cpu-interpreter"


def moebench(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("MOEBENCH_PLUGINS",)}
    env.update(TRITON_INTERPRET="1", COLUMNS="200", PYTHONPATH=str(ROOT))
    return warm.run(args, cwd=cwd, env=env, timeout=600)


def one_line(text: str) -> bool:
    """One error line (the interpreter's note may come before it), no traceback."""
    lines = [x for x in text.strip().splitlines() if not x.startswith("No CUDA device")]
    return len(lines) == 1 and lines[0].startswith("error: ")


def test_editing_a_plugin_reruns_its_cases_and_only_those(tmp_path):
    plug = tmp_path / "count_histogram.py"
    shutil.copy(EXAMPLES / "count_histogram.py", plug)
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nplugins: [count_histogram.py]\n"
                    "variants: [persistent, histogram]\nbaseline: {variant: persistent, block_size: 64}\n"
                    "axes: {tokens: [0, 30]}\nfixed: {buffer_tokens: 32, block_size: 64}\n")
    out = tmp_path / "r"
    r = moebench("sweep", spec, "--out", out)
    assert r.returncode == 0, r.stderr
    r = moebench("sweep", spec, "--out", out, "--resume")
    assert r.returncode == 0 and "kept 4 of 4" in r.stderr, r.stderr
    plug.write_text(plug.read_text() + "\n# edited: the kernel may differ now\n")
    r = moebench("sweep", spec, "--out", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert "kept 2 of 4" in r.stderr and "code.variants.histogram" in r.stderr, r.stderr


def _spec(path: Path, tokens: str = "[0, 5, 40]", name: str = "small") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"name: {name}\nfamily: count\nmodel: qwen3-30b-a3b\nvariants: [persistent]\n"
                    f"baseline: {{variant: persistent, block_size: 64}}\naxes: {{block_size: [64], tokens: {tokens}}}\n"
                    "fixed: {buffer_tokens: 64}\n")
    return path


def test_md_never_replaces_a_bigger_page(tmp_path):
    spec, out = _spec(tmp_path / "s.yaml"), tmp_path / "r"
    assert moebench("sweep", spec, "--out", out, "--format", "json,md").returncode == 0
    page = out / DEV / "small.md"
    before = page.read_text()
    _spec(spec, "[0]")  # the same spec, edited to fewer cases
    r = moebench("sweep", spec, "--out", out, "--format", "md")
    assert r.returncode == 2 and "holds 3 records" in r.stderr and one_line(r.stderr), r.stderr
    assert page.read_text() == before
    assert moebench("sweep", spec, "--out", out, "--format", "md", "--force").returncode == 0
    assert page.read_text() != before


def test_md_alone_never_replaces_a_bigger_page(tmp_path):
    spec, out = _spec(tmp_path / "s.yaml"), tmp_path / "r"
    assert moebench("sweep", spec, "--out", out, "--format", "md").returncode == 0
    page = out / DEV / "small.md"
    before = page.read_text()
    _spec(spec, "[5]")
    r = moebench("sweep", spec, "--out", out, "--format", "md")
    assert r.returncode == 2 and "holds 3 records" in r.stderr and one_line(r.stderr), r.stderr
    assert page.read_text() == before


def test_another_spec_of_the_same_name_is_not_replaced(tmp_path):
    a, b, out = _spec(tmp_path / "a" / "s.yaml"), _spec(tmp_path / "b" / "s.yaml", "[0, 5, 7]"), tmp_path / "r"
    assert moebench("sweep", a, "--out", out).returncode == 0
    before = (out / DEV / "small.json").read_text()
    r = moebench("sweep", b, "--out", out)
    assert r.returncode == 2 and "another spec named 'small'" in r.stderr and one_line(r.stderr), r.stderr
    assert (out / DEV / "small.json").read_text() == before
    _spec(a, "[0, 5, 9]")  # the same file edited is the same spec: its results are replaced
    assert moebench("sweep", a, "--out", out).returncode == 0
    assert moebench("sweep", b, "--out", out, "--force").returncode == 0


def test_plot_never_overwrites_a_committed_figure(tmp_path):
    src = ROOT / "results" / "h200"
    dst = tmp_path / "results" / "h200"
    dst.mkdir(parents=True)
    for f in ("count-block.json", "count-block.png"):
        shutil.copy(src / f, dst / f)
    figure = (dst / "count-block.png").read_bytes()
    r = moebench("plot", "results/h200/count-block.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (dst / "count-block.png").read_bytes() == figure
    made = tmp_path / "out" / "h200" / "count-block.png"
    assert made.is_file() and str(Path("out") / "h200" / "count-block.png") in r.stdout
    r = moebench("plot", "results/h200/count-block.json", cwd=tmp_path)
    assert r.returncode == 2 and "exists; not replaced" in r.stderr and one_line(r.stderr)
    r = moebench("plot", "results/h200/count-block.json", "-o", dst / "count-block.png", cwd=tmp_path)
    assert r.returncode == 2 and (dst / "count-block.png").read_bytes() == figure
    assert moebench("plot", "results/h200/count-block.json", "--force", cwd=tmp_path).returncode == 0


def test_recommend_and_conformance_never_overwrite_an_input(tmp_path, capsys):
    """`recommend -o` and `conformance -o` onto their own input (or through a link to it): exit 2,
    the input intact; an existing file is replaced only with --force, through a link, not over it."""
    from clirun import run_cli

    cb, cg = tmp_path / "cb.json", tmp_path / "count-grid.json"
    shutil.copy(ROOT / "results" / "h200" / "count-block.json", cb)
    shutil.copy(ROOT / "results" / "h200" / "count-grid.json", cg)
    before = cb.read_bytes(), cg.read_bytes()
    (tmp_path / "link.env").symlink_to(cb)
    for cmd in (["recommend", str(cb), "--emit", "env", "-o", str(cb)],
                ["recommend", str(cb), "--emit", "env", "-o", str(tmp_path / "link.env"), "--force"],
                ["conformance", str(cg), "-o", str(tmp_path / "count-grid")]):
        code, _, err = run_cli(cmd, capsys)
        assert code == 2 and "is one of the inputs" in err and one_line(err), (cmd, err)
    assert (cb.read_bytes(), cg.read_bytes()) == before
    env = tmp_path / "x.env"
    env.write_text("old\n")
    code, _, err = run_cli(["recommend", str(cb), "--emit", "env", "-o", str(env)], capsys)
    assert code == 2 and "exists; not replaced" in err and env.read_text() == "old\n"
    real = tmp_path / "real.env"
    real.write_text("old\n")
    env.unlink()
    env.symlink_to(real)
    assert run_cli(["recommend", str(cb), "--emit", "env", "-o", str(env), "--force"], capsys)[0] == 0
    assert env.is_symlink() and "MCORE_COUNT_TOKENS_BLOCK" in real.read_text()


def test_conformance_without_twin_pairs_vouches_for_nothing(tmp_path, capsys):
    """A results file with no seed/upstream pair: exit 2 'no twin pairs', nothing written (not exit
    1, 'a case failed', when nothing failed)."""
    from clirun import run_cli

    code, _, err = run_cli(["conformance", str(ROOT / "results" / "h200" / "count-block.json"), "-o",
                            str(tmp_path / "conf")], capsys)
    assert code == 2 and "no twin pairs: nothing to compare" in err and one_line(err), err
    assert not list(tmp_path.iterdir())


def test_a_failed_plot_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    """plot --counters on results without counters fails before writing: its default folder
    out/FOLDER/ is not left behind."""
    from clirun import run_cli

    (tmp_path / "r").mkdir()
    res = tmp_path / "r" / "cb.json"
    shutil.copy(ROOT / "results" / "h200" / "count-block.json", res)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["plot", str(res), "--counters"], capsys)
    assert code == 2, err
    assert not (tmp_path / "out").exists()
