"""A full disk is the machine's problem, not a bug: whichever write meets it (a stage's
artifact, the report and lock after a failed stage, doit's own state file), the user reads one
`error:` line that says what and what to do, never a traceback or "internal error"."""

from __future__ import annotations

import errno
import sqlite3

from doit.dependency import SqliteDB

from npubuild import cli
import npubuild.stages.split as split_stage
from npubuild.engine import session as engine


def _full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _run(tiny_recipe, tmp_path, capsys) -> tuple[int, str]:
    code = cli.main(["run", str(tiny_recipe), "--build-dir", str(tmp_path / "b"),
                     "--cache", str(tmp_path / "c")])
    return code, capsys.readouterr().err


def test_a_stage_that_meets_a_full_disk_fails_by_name_and_stops_the_build(
        tiny_recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(split_stage, "run", _full_disk)
    code, err = _run(tiny_recipe, tmp_path, capsys)
    assert code == 1
    assert "error: split: cannot write or read a file: No space left on device" in err
    assert "hint: free disk space or build elsewhere (--build-dir, --cache)" in err
    assert "skipped after the failure: quantize, compile, verify" in err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "b/tiny/split/manifest.json").exists()


def test_the_stages_error_is_told_when_the_report_cannot_be_written_either(
        tiny_recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(split_stage, "run", _full_disk)
    monkeypatch.setattr(engine.BuildSession, "finish", _full_disk)
    code, err = _run(tiny_recipe, tmp_path, capsys)
    assert code == 1 and "error: split: cannot write or read" in err
    assert "Traceback" not in err and "internal error" not in err


def test_a_full_disk_outside_any_stage_is_not_called_a_bug(tiny_recipe, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.setattr(engine.BuildSession, "finish", _full_disk)
    code, err = _run(tiny_recipe, tmp_path, capsys)
    assert code == 1
    assert "error: cannot write or read a file: No space left on device" in err
    assert "internal error" not in err and "Traceback" not in err


def test_doits_state_file_on_a_full_disk_is_one_message_not_doits_traceback(
        tiny_recipe, tmp_path, capsys, monkeypatch):
    def dump(self):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqliteDB, "dump", dump)
    code, err = _run(tiny_recipe, tmp_path, capsys)
    assert code == 1
    assert ("sqlite3.OperationalError: database or disk is full\n"
            "  hint: free disk space or build elsewhere (--build-dir)") in err
    assert "error: doit could not keep its state in" in err
    assert "Traceback" not in err
