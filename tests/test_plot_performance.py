"""benchmarks/plot_performance.py: docs/performance.md's tables read back, and its figures
drawn from a few rows (and from peers.py's --plot). Times nothing."""

import pathlib
import struct

import pytest

from conftest import benchmark_script

plots = benchmark_script("plot_performance")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _row(path, kind, size, cell, bidirectional, ragged, ratio):
    return dict(path=path, size=size, kind=kind, cell=cell, bidirectional=bidirectional,
                ragged=ragged, ours_ms=10.0 * ratio, theirs_ms=10.0, ratio=ratio,
                ours_spread=1.25, theirs_spread=1.5)


ROWS = [_row("torch", "step", "small", "lstm", False, False, 1.1),
        _row("torch", "step", "large", "rnn_tanh", True, True, 0.25),
        _row("torch", "forward", "medium", "gru", True, False, 0.97),
        _row("keras-jax", "step", "small", "gru", False, True, 1.25)]


def _size(png):
    """A PNG's width and height, from its header."""
    data = pathlib.Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_tables_read_back_as_the_rows_they_were_written_from():
    text = "# Page\n\nSome prose.\n\n" + plots.markdown(ROWS) + "\nMore prose.\n"
    assert text.count("<!-- peers:") == 3  # one table per path and kind
    key = lambda r: (r["path"], r["kind"], r["size"], r["cell"])  # noqa: E731
    assert sorted(plots.read_tables(text), key=key) == sorted(ROWS, key=key)


def test_the_page_holds_every_row_of_the_comparison():
    rows = plots.read_tables((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))
    assert len(rows) == 288
    assert {r["path"] for r in rows} == set(plots.TITLES)


def test_one_figure_per_framework_and_an_overview_each_fitting_a_screen(tmp_path):
    pytest.importorskip("matplotlib")
    names = plots.plot_all(ROWS, str(tmp_path))
    assert [pathlib.Path(n).name for n in names] == [
        "peers-overview.png", "peers-torch.png", "peers-keras-jax.png"]
    assert all(_size(n) == (1000, 500) for n in names)


def test_the_script_draws_from_a_page_and_prints_its_tables(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    page = tmp_path / "page.md"
    page.write_text(plots.markdown(ROWS), encoding="utf-8")
    plots.main(["--page", str(page), "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "peers-keras-jax.png", "peers-overview.png", "peers-torch.png"]
    plots.main(["--page", str(page), "--tables"])
    assert plots.read_tables(capsys.readouterr().out) == plots.read_tables(page.read_text())


def test_peers_plot_draws_the_same_figures_and_marks_a_control_run(tmp_path):
    pytest.importorskip("matplotlib")
    peers = benchmark_script("peers")
    control = [dict(r, control=True) for r in ROWS if r["path"] == "torch"]
    names = peers.plot(control, str(tmp_path / "figures"))
    assert [pathlib.Path(n).name for n in names] == ["peers-overview.png", "peers-torch.png"]
    assert plots._control(control) and not plots._control(ROWS)
