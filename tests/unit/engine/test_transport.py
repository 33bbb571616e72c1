"""The remote's transports: deadlines on every call, no secret in any message, and a file://
remote read and written without following a symlink or blocking on a special file."""

from __future__ import annotations

import os
import threading
import time

import pytest

from npubuild.engine.cache import CacheCorrupt, EntryMissing
from npubuild.engine.transport import (LocalTransport, Unreachable, call_with_deadline, redact,
                                       scrub)

PARTS = ("ab", "ab" * 32, "model.onnx")


def test_a_call_that_never_returns_is_given_up_at_its_deadline():
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(Unreachable, match="no answer within 1 s"):
        call_with_deadline(never.wait, 1.0)
    assert time.monotonic() - started < 3


def test_a_calls_own_error_and_value_come_back():
    assert call_with_deadline(sum, 5, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(lambda: 1 / 0, 5)


@pytest.mark.parametrize("url, shown", [
    ("s3://AKIAKEY:s3cr%2Fet@bucket/prefix", "s3://***@bucket/prefix"),
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("gs://token@bucket/x/y", "gs://***@bucket/x/y"),
])
def test_credentials_in_a_url_are_never_shown(url, shown):
    assert redact(url) == shown


def test_an_error_message_quoting_the_credentials_is_scrubbed():
    url = "s3://AKIAKEY:s3cr%2Fet@bucket/prefix"
    text = scrub("InvalidAccessKeyId AKIAKEY with s3cr/et (s3cr%2Fet)", url)
    assert "AKIAKEY" not in text and "s3cr" not in text


def make_file(root, data=b"abc"):
    folder = root.joinpath(*PARTS[:2])
    folder.mkdir(parents=True)
    (folder / PARTS[2]).write_bytes(data)
    return folder / PARTS[2]


def test_a_regular_file_is_read_with_its_size(tmp_path):
    make_file(tmp_path)
    reader, size = LocalTransport(str(tmp_path)).open(PARTS)
    with reader:
        assert (size, reader.read()) == (3, b"abc")


def test_an_absent_file_is_missing_not_corrupt(tmp_path):
    with pytest.raises(EntryMissing):
        LocalTransport(str(tmp_path)).open(PARTS)


@pytest.mark.parametrize("plant", ["dev_zero", "fifo", "dir_symlink"])
def test_symlinks_and_special_files_are_refused_at_once(tmp_path, plant):
    path = make_file(tmp_path)
    path.unlink()
    if plant == "dev_zero":
        path.symlink_to("/dev/zero")
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        real = tmp_path / "elsewhere"
        real.mkdir()
        (real / PARTS[2]).write_bytes(b"abc")
        path.parent.rename(tmp_path / "gone")
        (tmp_path / PARTS[0] / PARTS[1]).symlink_to(real)
    started = time.monotonic()
    with pytest.raises(CacheCorrupt) as info:
        LocalTransport(str(tmp_path)).open(PARTS)
    assert not isinstance(info.value, EntryMissing)
    assert time.monotonic() - started < 1


def test_a_put_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    path = make_file(tmp_path / "remote")
    path.unlink()
    path.symlink_to(precious)
    LocalTransport(str(tmp_path / "remote")).put(PARTS, [b"new ", b"bytes"])
    assert precious.read_text() == "keep me"
    assert not path.is_symlink() and path.read_bytes() == b"new bytes"
    assert [p.name for p in path.parent.iterdir()] == [PARTS[2]]  # no temporary left


def test_a_put_through_a_symlinked_folder_is_refused_for_that_entry_only(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "remote" / PARTS[0]).mkdir(parents=True)
    (tmp_path / "remote" / PARTS[0] / PARTS[1]).symlink_to(outside)
    with pytest.raises(CacheCorrupt):
        LocalTransport(str(tmp_path / "remote")).put(PARTS, [b"x"])
    assert list(outside.iterdir()) == []


def test_a_remote_root_that_is_not_a_folder_is_unreachable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(Unreachable):
        LocalTransport(str(tmp_path / "file")).open(PARTS)
