"""build_series' command line: --check on the committed tree by default, and --verl-src reaching both the
check and the build (a release of another version is refused before anything is written)."""
import shutil
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402


@pytest.fixture
def other_release(tmp_path):
    stamp = tmp_path / "verl-src" / "verl" / "version" / "version"
    stamp.parent.mkdir(parents=True)
    stamp.write_text("0.0.1\n", encoding="utf-8")
    return str(tmp_path / "verl-src")


def test_check_defaults_to_this_repository():
    assert build_series.main(["--check"]) == 0


def test_check_reads_the_given_release(other_release, capsys):
    assert build_series.main(["--check", "--verl-src", other_release]) == 1
    assert capsys.readouterr().err == (f"build_series: --verl-src {other_release}: verl version 0.0.1, "
                                       f"the series needs {next(iter(build_series.spec.VERL_SERIES))}\n")


def test_build_reads_the_given_release(other_release, tmp_path, monkeypatch, capsys):
    for name in ("mindspeed-rl", "verl"):  # a copy of the series, so a wrong build cannot touch the real one
        shutil.copytree(PATCHES / name, tmp_path / "patches" / name)
    monkeypatch.setattr(build_series, "REPO", tmp_path)
    monkeypatch.setattr(build_series, "OUT", tmp_path / "patches" / "mindspeed-rl")
    monkeypatch.setattr(build_series, "VERL_OUT", tmp_path / "patches" / "verl")
    assert build_series.main(["--verl-src", other_release, "--package", str(PATCHES.parent)]) == 1
    assert "verl version 0.0.1" in capsys.readouterr().err
