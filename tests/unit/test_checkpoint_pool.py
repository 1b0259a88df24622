"""The sessions' checkpoints under the disk cap (`domain.checkpoint_pool`): the oldest record
dropped first, its file overwritten by a later checkpoint, never a new file past the cap."""

from __future__ import annotations

from domain.checkpoint_pool import CheckpointPool, pool_filename
from domain.prompt_cache import Checkpoint

MB = 1_000_000


def checkpoint(name: str, size: int) -> Checkpoint:
    return Checkpoint(0, name, size // 1000, size, "t" * 64, "m", 4096, 10, "d" * 64)


def save(pool: CheckpointPool, session: str, size: int) -> list[str]:
    name = pool.file_for(session)
    assert name is not None
    return pool.saved(session, checkpoint(name, size))


def test_files_are_named_from_a_pool_per_model_and_never_after_the_session() -> None:
    pool = CheckpointPool(10 * MB, "m")
    assert pool.file_for("a/../../etc") == pool_filename(0, "m")
    assert pool_filename(0, "m") != pool_filename(0, "n")
    assert "/" not in pool_filename(3, "a/b") and pool_filename(3, "m").endswith("-session-3.bin")


def test_a_session_saved_again_overwrites_its_own_file() -> None:
    pool = CheckpointPool(10 * MB, "m")
    save(pool, "a", MB)
    first = pool.checkpoint("a")
    save(pool, "a", 2 * MB)
    again = pool.checkpoint("a")
    assert first is not None and again is not None and again.filename == first.filename
    assert pool.on_disk == 2 * MB and len(pool.files) == 1


def test_the_oldest_records_are_dropped_first_to_keep_the_records_within_the_cap() -> None:
    pool = CheckpointPool(3 * MB, "m")
    for session in "abc":
        assert save(pool, session, MB) == []
    save(pool, "a", MB)  # a is now the newest: b, c, a
    b = pool.checkpoint("b")
    name = pool.file_for("d")  # the files fill the cap: b's file, b dropped
    assert b is not None and name == b.filename and pool.checkpoint("b") is None
    assert pool.saved("d", checkpoint(name, 2 * MB)) == ["c"]  # c, a, d: 4 MB; c, the oldest, goes
    assert list(pool.records) == ["a", "d"] and pool.on_record == 3 * MB


def test_a_new_checkpoint_past_the_cap_overwrites_the_oldest_records_file() -> None:
    pool = CheckpointPool(3 * MB, "m")
    for session in "abc":
        save(pool, session, MB)
    names = set(pool.files)
    oldest = pool.checkpoint("a")
    name = pool.file_for("d")
    assert oldest is not None and name == oldest.filename  # the files fill the cap: no new name
    assert pool.checkpoint("a") is None  # dropped at once: nobody restores a file being written
    pool.saved("d", checkpoint(name, MB))
    assert set(pool.files) == names and pool.on_disk == 3 * MB


def test_a_dropped_records_file_is_the_next_new_checkpoints_before_any_new_file() -> None:
    pool = CheckpointPool(3 * MB, "m")
    save(pool, "a", MB)
    save(pool, "b", MB)
    save(pool, "a", 5 * MB // 2)  # a grew: b, the oldest, is dropped; its file stays on disk
    assert set(pool.records) == {"a"} and len(pool.free) == 1
    freed = pool.free[0]
    assert pool.file_for("c") == freed


def test_files_of_one_size_never_exceed_the_cap_by_more_than_one_checkpoint() -> None:
    pool = CheckpointPool(5 * MB, "m")
    for turn in range(40):
        save(pool, f"s{turn % 9}", MB)
        assert pool.on_record <= 5 * MB
        assert pool.on_disk <= 6 * MB


def test_a_record_being_restored_is_never_handed_to_another_sessions_save() -> None:
    pool = CheckpointPool(2 * MB, "m")
    save(pool, "a", MB)
    save(pool, "b", MB)
    a, b = pool.begin_restore("a"), pool.checkpoint("b")
    assert a is not None and b is not None
    assert pool.file_for("c") == b.filename  # a is older, and being restored: b's file is taken
    assert pool.checkpoint("a") == a
    pool.end_restore("a")
    assert pool.restoring == {}


def test_a_failed_save_frees_its_file_and_forgets_what_the_file_held() -> None:
    pool = CheckpointPool(10 * MB, "m")
    save(pool, "a", MB)
    name = pool.file_for("a")
    assert name is not None
    pool.failed("a", name)
    assert pool.checkpoint("a") is None and name in pool.free


def test_a_cap_of_zero_keeps_no_checkpoint() -> None:
    assert CheckpointPool(0, "m").file_for("a") is None
