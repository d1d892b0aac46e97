"""The demo's options: every knob described, bad values refused before any work is done."""

from __future__ import annotations

import pytest

from pipeline.defs import demo


def test_help_describes_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--sample",
        "--lose-fraction",
        "--fail-item-fraction",
        "--world-size",
        "--timeout",
    ):
        assert option in text
    assert "digits" in text and "wine" in text and "torchrun" in text and "PARTIAL" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lose-fraction", "1.5"], "1.5 is not a fraction between 0 and 1"),
        (["--fail-item-fraction", "-0.1"], "-0.1 is not a fraction between 0 and 1"),
        (["--world-size", "0"], "0 is not a whole number >= 1"),
        (["--timeout", "inf"], "inf is not a finite number > 0"),
        (["--sample", "iris"], "invalid choice: 'iris'"),
    ],
)
def test_a_bad_option_is_refused_before_any_work(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "home").exists()  # nothing staged, submitted or started
