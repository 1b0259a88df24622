"""The sessions' checkpoints under a disk cap: which file a session's checkpoint is saved to, and
which records are dropped, oldest first. Pure bookkeeping; the saves and restores are
`app._async.sessions`'.

llama-server saves a slot to a file in its `--slot-save-path` folder and cannot delete one. So
the files are named from a pool (`inferpath-<model digest>-session-<n>.bin`) and a record that
is dropped leaves its file behind, to be overwritten by a later checkpoint. The cap bounds:

- the checkpoints on record: after every save they total at most `cap_bytes`, the records
  saved longest ago dropped first (one checkpoint larger than the cap is kept, alone; one being
  restored at that moment is kept too, and dropped by a later save if it is then the oldest);
- the files: a session's checkpoint goes to its own file when it has one, else to a file whose
  record was dropped, else to a new file while the pool's files (at the size this client last
  wrote each) total less than the cap, else to the file of the oldest record, which is dropped.
  So the folder holds at most the cap plus one checkpoint in files this client wrote, plus
  whatever overwriting a file with a larger checkpoint added to it (a session that grew).

A record being restored is never handed to another session's save (its file would change under
the restore). A file reserved for a save is another's only after `saved` or `failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.hashing import sha256
from domain.prompt_cache import Checkpoint

__all__ = ["CheckpointPool", "pool_filename"]


def pool_filename(index: int, model: str) -> str:
    """The pool's file number `index` for `model` (a router's models share the folder)."""
    return f"inferpath-{sha256(model.encode('utf-8')).hex()[:16]}-session-{index}.bin"


@dataclass(slots=True)
class CheckpointPool:
    """Per session, its last checkpoint; per file of the pool, the bytes last written to it."""

    cap_bytes: int
    model: str
    records: dict[str, Checkpoint] = field(default_factory=dict)  # oldest save first
    files: dict[str, int] = field(default_factory=dict)  # every file written, and its bytes
    free: list[str] = field(default_factory=list)  # files whose record was dropped
    reserved: set[str] = field(default_factory=set)
    restoring: dict[str, int] = field(default_factory=dict)

    @property
    def on_record(self) -> int:
        """The bytes of the checkpoints on record."""
        return sum(checkpoint.bytes for checkpoint in self.records.values())

    @property
    def on_disk(self) -> int:
        """The bytes of every file of the pool, as this client last wrote it."""
        return sum(self.files.values())

    def checkpoint(self, session: str) -> Checkpoint | None:
        return self.records.get(session)

    def file_for(self, session: str) -> str | None:
        """Reserve the file a save of `session` goes to; None when no file may take it (the
        cap is 0, or every record is being restored and the files fill the cap)."""
        if self.cap_bytes <= 0:
            return None
        own = self.records.get(session)
        if own is not None and own.filename not in self.reserved:
            name = own.filename
        elif self.free:
            name = max(self.free, key=lambda free: (self.files.get(free, 0), free))
            self.free.remove(name)
        elif self.on_disk < self.cap_bytes:
            name = self._new_name()
        else:
            oldest = next((key for key in self.records if self._spare(key, session)), None)
            if oldest is None:
                return None
            name = self.records.pop(oldest).filename
        self.reserved.add(name)
        return name

    def saved(self, session: str, checkpoint: Checkpoint) -> list[str]:
        """Record `session`'s checkpoint (the newest) in its reserved file; the sessions whose
        records were dropped to keep the records within the cap, oldest first."""
        name = checkpoint.filename
        self.reserved.discard(name)
        old = self.records.pop(session, None)
        if old is not None and old.filename != name:
            self.free.append(old.filename)
        self.records[session] = checkpoint
        self.files[name] = checkpoint.bytes
        dropped = []
        while self.on_record > self.cap_bytes:
            oldest = next((key for key in self.records if self._spare(key, session)), None)
            if oldest is None:
                break
            self.free.append(self.records.pop(oldest).filename)
            dropped.append(oldest)
        return dropped

    def failed(self, session: str, name: str) -> None:
        """A save to `name` did not happen (or did not say so): the file is free again, unless
        it is still `session`'s own; what it holds now is unknown, so its record is dropped."""
        self.reserved.discard(name)
        own = self.records.get(session)
        if own is not None and own.filename == name:
            del self.records[session]
        if name not in self.free:
            self.free.append(name)

    def drop(self, session: str) -> None:
        """Forget `session`'s record (it will not be restored): its file is free."""
        old = self.records.pop(session, None)
        if old is not None and old.filename not in self.reserved:
            self.free.append(old.filename)

    def begin_restore(self, session: str) -> Checkpoint | None:
        """`session`'s checkpoint, kept from other saves until `end_restore`."""
        checkpoint = self.records.get(session)
        if checkpoint is not None:
            self.restoring[session] = self.restoring.get(session, 0) + 1
        return checkpoint

    def end_restore(self, session: str) -> None:
        left = self.restoring.get(session, 0) - 1
        if left > 0:
            self.restoring[session] = left
        else:
            self.restoring.pop(session, None)

    def _spare(self, key: str, session: str) -> bool:
        return key != session and key not in self.restoring

    def _new_name(self) -> str:
        index = len(self.files) + len(self.reserved - self.files.keys())
        name = pool_filename(index, self.model)
        while name in self.files or name in self.reserved:
            index += 1
            name = pool_filename(index, self.model)
        return name
