"""The write-ahead log on real files: a crash's torn tail is dropped, damage before the end is never cut off
silently (refused, or set aside on request with every intact record kept), and one process at a time holds a
run directory."""

import logging
import subprocess
import sys
import textwrap

import pytest

from robotrl.runtime.run_lock import RunDirectoryInUse, hold_run_dir
from robotrl.runtime.transport.config import ServeConfig
from robotrl.runtime.transport.wal import DamagedLogError, WriteAheadLog

RECORDS = [b"one" * 10, b"two" * 20, b"three" * 30, b"four" * 40]


def written_log(path, records=RECORDS):
    """A log holding `records`; returns the byte offset where each record's frame starts."""
    wal = WriteAheadLog(path)
    starts = []
    for record in records:
        starts.append(wal.size_bytes)
        wal.append(record)
    wal.close()
    return starts


def flip_bit(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def aside_files(directory):
    return sorted(p.name for p in directory.iterdir() if ".corrupt-" in p.name)


def test_a_torn_final_frame_is_dropped_and_everything_before_it_replayed(tmp_path):
    path = tmp_path / "wal.log"
    written_log(path)
    whole = path.read_bytes()
    wal = WriteAheadLog(path)
    wal.append(b"five" * 50)
    wal.close()
    path.write_bytes(path.read_bytes()[:-7])  # the last write cut short by a crash: never acknowledged
    assert WriteAheadLog(path).read() == RECORDS
    assert path.read_bytes() == whole and aside_files(tmp_path) == []


@pytest.mark.parametrize("tail", [b"R", b"RWL2\x05\x00", b"\x00" * 300])
def test_a_partial_header_or_a_zero_filled_tail_is_a_torn_write(tmp_path, tail):
    path = tmp_path / "wal.log"
    written_log(path)
    whole = path.read_bytes()
    path.write_bytes(whole + tail)
    assert WriteAheadLog(path).read() == RECORDS
    assert path.read_bytes() == whole


def test_a_bit_flipped_in_a_middle_frame_is_refused_naming_the_file_and_offset(tmp_path):
    path = tmp_path / "wal.log"
    starts = written_log(path)
    damaged_at = starts[1] + 30  # inside the second record's payload
    flip_bit(path, damaged_at)
    before = path.read_bytes()
    wal = WriteAheadLog(path)
    with pytest.raises(DamagedLogError) as err:
        wal.read()
    message = str(err.value)
    assert str(path) in message and f"byte {starts[1]}" in message
    assert "server.wal_on_corruption=set_aside" in message
    assert "1 intact record before it and 2 after it" in message
    wal.close()
    assert path.read_bytes() == before and aside_files(tmp_path) == []


def test_damage_set_aside_on_request_keeps_the_file_and_replays_every_intact_frame(tmp_path, caplog):
    path = tmp_path / "wal.log"
    starts = written_log(path)
    flip_bit(path, starts[1] + 30)
    damaged = path.read_bytes()
    wal = WriteAheadLog(path, on_corruption="set_aside")
    with caplog.at_level(logging.WARNING):
        records = wal.read()
    assert records == [RECORDS[0], RECORDS[2], RECORDS[3]]  # the frames after it too: its length is checksummed
    (aside,) = aside_files(tmp_path)
    assert aside.startswith("wal.log.corrupt-") and (tmp_path / aside).read_bytes() == damaged
    assert aside in caplog.text and f"byte {starts[1]}" in caplog.text
    wal.append(b"five")  # the log goes on from the intact records, durable until the next checkpoint
    wal.close()
    assert WriteAheadLog(path).read() == [*records, b"five"]


def test_a_damaged_header_keeps_what_follows_aside_instead_of_guessing_frame_boundaries(tmp_path):
    path = tmp_path / "wal.log"
    starts = written_log(path)
    flip_bit(path, starts[2] + 6)  # the third frame's declared length: where the next frame starts is unknown
    with pytest.raises(DamagedLogError, match=f"byte {starts[2]} .*2 intact records before it.*not recovered"):
        WriteAheadLog(path).read()
    assert WriteAheadLog(path, on_corruption="set_aside").read() == RECORDS[:2]
    assert len(aside_files(tmp_path)) == 1


def test_a_length_damaged_to_run_past_the_end_is_not_taken_for_a_torn_tail(tmp_path):
    path = tmp_path / "wal.log"
    starts = written_log(path)
    data = bytearray(path.read_bytes())
    data[starts[1] + 11] = 0x7F  # the length's high bytes: it now runs far past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedLogError, match=f"byte {starts[1]}"):
        WriteAheadLog(path).read()
    assert path.read_bytes() == bytes(data)


def test_a_log_written_before_header_checksums_is_still_read(tmp_path):
    import struct
    import zlib

    path = tmp_path / "wal.log"
    legacy = b"".join(struct.pack("<4sQI", b"RWAL", len(r), zlib.crc32(r)) + r for r in RECORDS[:2])
    path.write_bytes(legacy + b"RWAL\x99")  # and a torn tail
    wal = WriteAheadLog(path)
    assert wal.read() == RECORDS[:2]
    wal.append(RECORDS[2])
    wal.close()
    assert WriteAheadLog(path).read() == RECORDS[:3]


def test_the_corruption_policy_is_a_checked_config_value():
    assert ServeConfig().wal_on_corruption == "refuse"
    with pytest.raises(ValueError, match=r"server\.wal_on_corruption must be one of refuse, set_aside, got 'drop'"):
        ServeConfig(wal_on_corruption="drop").validate()


# ---- the run directory lock ----------------------------------------------------------------------------


def test_a_run_directory_held_by_another_process_is_refused_naming_it_and_its_pid(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from robotrl.runtime.run_lock import hold_run_dir
                hold_run_dir({str(run_dir)!r})
                print("held", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirectoryInUse) as err:
            hold_run_dir(run_dir)
        assert str(run_dir) in str(err.value) and f"pid {holder.pid}" in str(err.value)
    finally:
        holder.stdin.close()
        holder.wait(10)
    hold_run_dir(run_dir)  # released when its holder exits
    hold_run_dir(run_dir)  # and held again by the same process: no conflict with itself
