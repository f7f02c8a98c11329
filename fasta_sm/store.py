"""StateStore: one msgpack file per kernel key, replaced atomically, under a file lock.

The store knows files, locks and the state format (it decodes a file to check it
holds the key asked for); it knows nothing of the algorithm. A file
it cannot read is moved aside (quarantined) and the caller starts afresh, so a
damaged file can never break a compile.
"""

from __future__ import annotations

import contextlib
import errno
import filecmp
import fnmatch
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from .env import env_value
from .env_numbers import real_from_env
from .errors import LockTimeout, StateDirError, StateFileError, TuneFailed
from .files import read_regular
from .state import FinishedTune, TuneState, peek_kernel, unpack_finished, unpack_state

try:
    import fcntl
except ImportError:  # Windows, where filelock locks through msvcrt
    fcntl = None

log = logging.getLogger("fasta_sm.store")

STATE_DIR_ENV = "FASTA_SM_STATE_DIR"
LOCK_TIMEOUT_ENV = "FASTA_SM_LOCK_TIMEOUT"
STATE_SUFFIX = ".fsm"
LOCK_SUFFIX = ".lock"
SET_ASIDE_PATTERNS = (f"*{STATE_SUFFIX}.corrupt-*", f"*{STATE_SUFFIX}.superseded-*")
"""The names of states moved aside, quarantined or superseded (`quarantine`, `supersede`)."""
DEFAULT_LOCK_TIMEOUT_S = 600.0
PEEK_BYTES = 64 * 1024
"""How much of a state file `read_kernel` reads first: its key and kernel, the leading fields, are far shorter."""
PEEK_MOST_BYTES = 1024 * 1024
"""The most `read_kernel` reads, for a key longer than `PEEK_BYTES`: a stray file as large as memory is passed over."""
MOST_STATE_BYTES = 256 * 1024 * 1024
"""The largest state file read: a tune of 10,000 configs writes a few MB. A larger file is damaged and set aside
unread; read whole, it could exhaust memory, and a file that cannot be read for lack of memory is left in place,
to stop every tune of its key."""


def default_state_dir() -> Path:
    """`$FASTA_SM_STATE_DIR`, else the per-user cache dir (`~/.cache/fasta-sm/states` on Linux)."""
    configured = env_value(STATE_DIR_ENV)
    if configured is not None:
        return Path(configured).expanduser().absolute()
    return Path(platformdirs.user_cache_dir("fasta-sm")).absolute() / "states"


def default_lock_timeout() -> float:
    """Seconds a tune waits for another process's lock on its key: `$FASTA_SM_LOCK_TIMEOUT`, else the default."""
    raw = env_value(LOCK_TIMEOUT_ENV)
    return DEFAULT_LOCK_TIMEOUT_S if raw is None else real_from_env(LOCK_TIMEOUT_ENV, raw, infinite=True)


def file_stem(key: str) -> str:
    """File names come from a hash of the key, never from the raw (user-supplied) key.

    A key with lone surrogates (undecodable bytes `show` was given) hashes
    too: no state holds such a key, so its file is simply not there.
    """
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_HELD: dict[str, tuple[int, tuple[int, int] | None]] = {}
"""Lock file (`_held_name`) → the thread of this process holding it, and the (device, inode) of the lock file held.

One record per process, not per StateStore: `tune()` without a store, and
each integration's plan, open a store of their own over the same dir."""
if hasattr(os, "register_at_fork"):  # a forked child tunes nothing yet, whatever its parent's threads held
    os.register_at_fork(after_in_child=_HELD.clear)


def _held_name(lock_path: Path) -> str:
    """The key of `_HELD` for a lock file: its directory's real path and its name, so that two stores over one
    dir under two names (a symbolic link, a path through `..`) see one lock, as flock does."""
    return os.path.join(os.path.realpath(lock_path.parent), lock_path.name)


def _check_can_open(path: str) -> None:
    """Raise the OSError that opening (creating) the lock file at `path` meets, if any."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))


def checked_state_dir(path: Any) -> None:
    """Refuse, naming it, what cannot name a state dir: not a str or str path, or '' (Path('') would be the
    working directory: an unset variable). None, the default dir, passes."""
    if path is None:
        return
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(name, str):
        raise StateDirError(f"state dir {path!r} must be a path (a str or os.PathLike), or None for the default")
    if name == "":
        raise StateDirError("state dir '' is empty: name a directory, or give None for the default")


def state_dir_path(path: str | os.PathLike[str] | None) -> Path:
    """The absolute state dir `path` names (None: the default), refused if it can name none; not created."""
    checked_state_dir(path)
    # absolute: a later chdir must not send checkpoints away from the lock
    return Path(path).expanduser().absolute() if path is not None else default_state_dir()


def refuse_non_directory(path: Path) -> None:
    """A state dir that exists as something else (a file) is an error naming it; a missing one is made later."""
    if path.exists() and not path.is_dir():
        raise StateDirError(f"state dir {path} exists and is not a directory")


def store_file_kind(name: str) -> str | None:
    """What a file of this name is to a state dir: "a state file", "a state file set aside", "a lock", or None for
    a name no store gives its files."""
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in SET_ASIDE_PATTERNS):
        return "a state file set aside"
    if name.endswith(STATE_SUFFIX):
        return "a state file"
    if name.endswith(LOCK_SUFFIX):
        return "a lock"
    return None


class StateStore:
    """A directory of state files, one per kernel key."""

    def __init__(self, path: str | os.PathLike[str] | None = None, lock_timeout_s: float | None = None) -> None:
        self.path = state_dir_path(path)
        if lock_timeout_s is not None and not is_wait(lock_timeout_s):
            raise ValueError(f"state dir {self.path}: lock_timeout_s={lock_timeout_s!r} must be a number ≥ 0")
        self.lock_timeout_s = default_lock_timeout() if lock_timeout_s is None else lock_timeout_s
        self._ensure_dir()

    def _ensure_dir(self) -> None:
        refuse_non_directory(self.path)
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot create state dir {self.path}: {exc.strerror}") from None

    def file_for(self, key: str) -> Path:
        return self.path / (file_stem(key) + STATE_SUFFIX)

    def lock_path_for(self, key: str) -> Path:
        return self.path / (file_stem(key) + LOCK_SUFFIX)

    @contextlib.contextmanager
    def lock(self, key: str, kernel: str, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the kernel's lock; wait at most `timeout_s` for another process to finish."""
        timeout = self.lock_timeout_s if timeout_s is None else timeout_s
        self._ensure_dir()  # deleted since (a long-lived store): filelock would make it again, open to all
        me = threading.get_ident()
        path = self.lock_path_for(key)
        lock_path, held_key = str(path), _held_name(path)  # one entry whatever the dir is called (a link, a `..`)
        if _HELD.get(held_key, (None,))[0] == me:  # flock would make this thread wait for itself until the timeout
            raise TuneFailed(
                f"kernel {kernel!r}: this thread is tuning it already (a hook, do_bench or callback of the tune "
                "launched or tuned the same kernel with the same key)"
            )
        lock = filelock.FileLock(lock_path, timeout=timeout)
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                _check_can_open(lock_path)  # filelock reads a lock file it cannot create as one held: no one holds it
                if timeout <= 0:  # `ls` probing the lock holds it for microseconds: that is no tune
                    lock.acquire(timeout=PROBE_GRACE_S, poll_interval=PROBE_GRACE_S / 20)
                else:
                    log.info("kernel %s: %s is tuning it; waiting up to %g s for %s", kernel, self._holder(key),
                             timeout, lock.lock_file)
                    lock.acquire()
        except filelock.Timeout:
            raise LockTimeout(
                f"kernel {kernel!r}: {self._holder(key)} has held {lock.lock_file} for over {timeout:g} s "
                f"(raise {LOCK_TIMEOUT_ENV} to wait longer)"
            ) from None
        except OSError as exc:  # not writable, read-only, full; or something else in the lock's place
            raise StateDirError(
                f"kernel {kernel!r}: cannot create lock {exc.filename or lock.lock_file}: {_lock_trouble(path, exc)}"
            ) from None
        _HELD[held_key] = (me, _held_identity(lock))
        try:
            yield
        finally:
            _HELD.pop(held_key, None)
            lock.release()

    def _holder(self, key: str) -> str:
        return "another thread of this process" if _held_name(self.lock_path_for(key)) in _HELD else "another process"

    def _check_still_locked(self, key: str, kernel: str | None) -> None:
        """Refuse a checkpoint once the lock file this tune holds was deleted or replaced: another process may
        have locked a new file of that name and be tuning the kernel too, and the two would time configs twice."""
        path = self.lock_path_for(key)
        held = _HELD.get(_held_name(path), (None, None))[1]
        if held is None:  # not held here, or filelock does not show its descriptor
            return
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != held:
            raise StateDirError(
                f"kernel {kernel or key!r}: its lock file {path} was deleted or replaced while this tune held it; "
                "another process may be tuning it: stopped, the state file keeps the last checkpoint "
                "(never delete *.lock files while a tune may run)"
            )

    def is_locked(self, state_file: Path) -> bool | None:
        """Whether some process holds the lock beside `state_file` right now; None when this process cannot tell.

        The lock is probed through a read-only descriptor, so that `ls` answers
        on a state dir it may not write (a read-only mount, another user's
        cache). None: the lock file cannot be opened at all.
        """
        return _lock_held(state_file.with_suffix(LOCK_SUFFIX))

    def set_aside_in_use(self, path: Path) -> bool:
        """Whether `path` is a superseded state whose key some process holds the lock of right now, probed
        read-only as `is_locked` does: what `remove_set_aside` would keep, told without taking any lock."""
        lock_path = _superseded_lock(path)
        return lock_path is not None and _lock_held(lock_path) is True

    def load(self, key: str, notes: list[str] | None = None, kernel: str | None = None) -> TuneState | None:
        """The state for `key` (a tune of `kernel`, where given), or None if there is none or it had to be
        quarantined: a file holding another key, or another kernel's tune (a key names one kernel's tune).

        Why a file was quarantined is appended to `notes`, for the next state's record.
        """
        path = self.file_for(key)
        try:
            state = self.read_listed(path)  # StateDirError when it cannot be read for now: the file may be sound
        except FileNotFoundError:  # a link to nothing is no absent file: it is set aside, not written through
            return None
        except StateFileError as exc:
            why = str(exc)
        else:
            if state.key == key and kernel in (None, state.kernel):
                return state
            why = (f"{path}: holds key {state.key!r}, expected {key!r}" if state.key != key
                   else f"{path}: holds a tune of kernel {state.kernel!r}, not of {kernel!r}")
        self.quarantine(path, why, notes)
        return None

    @staticmethod
    def read(path: Path) -> TuneState:
        """Decode one state file; StateFileError if it is not a valid state, StateDirError if it cannot be read
        for now (the file may be sound)."""
        return _decoded(path, unpack_state)

    @staticmethod
    def read_finished(path: Path) -> FinishedTune | None:
        """The finished tune in the file at `path`, its timed configs alone decoded (None if it is not finished);
        errors as `read` raises them."""
        return _decoded(path, unpack_finished)

    @staticmethod
    def read_listed(path: Path) -> TuneState:
        """Decode an entry `state_files` lists, as `read` does; one that is there but is no file (a directory, a
        symbolic link to nothing) is a StateFileError saying so, not FileNotFoundError: `ls` lists it, so `show`
        must not call it absent."""
        if path.is_dir():
            raise StateFileError(f"{path}: unreadable (it is a directory, not a state file)")
        try:
            return StateStore.read(path)
        except FileNotFoundError:
            if not path.is_symlink():
                raise
            raise StateFileError(
                f"{path}: unreadable (a symbolic link to {os.readlink(path)}, which does not exist)"
            ) from None

    @staticmethod
    def read_kernel(path: Path) -> str | None:
        """The kernel the state file at `path` names, from its first bytes' fields (None if it does not start like
        a state): a quick look, which neither judges nor moves the file. OSError if it cannot be read."""
        for size in (PEEK_BYTES, PEEK_MOST_BYTES):
            head = read_regular(path, size)
            try:
                return peek_kernel(head, complete=len(head) < size)
            except EOFError:  # a key longer than the head: once more, with a longer head
                continue
        return None  # a first field longer than any key: not a state file

    def quarantine(self, path: Path, why: str, notes: list[str] | None = None) -> Path:
        """Move a bad file aside, warn once naming both paths, and return the new path.

        Why is also appended to `notes`, for the next state's record.
        """
        stamp = _stamp()
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        attempt = 0
        while os.path.lexists(target):  # a coarse clock must not let one quarantined file replace another
            attempt += 1  # (lexists: a link set aside before, dangling, is there too)
            target = path.with_name(f"{path.name}.corrupt-{stamp}-{attempt}")
        try:
            os.replace(path, target)
        except OSError as exc:
            raise StateDirError(f"cannot move bad state file {path} aside ({why}): {exc.strerror or exc}") from None
        log.warning("quarantined state file %s as %s (%s)", path, target, why)
        if notes is not None:
            notes.append(f"previous state quarantined as {target.name}: {why}")
        return target

    def write(self, key: str, blob: bytes, kernel: str | None = None) -> Path:
        """Atomically replace the key's file: temp file, fsync, rename, fsync the directory."""
        self._check_still_locked(key, kernel)
        path = self.file_for(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=path.name + ".", suffix=".tmp")
        except OSError as exc:
            raise StateDirError(
                f"kernel {kernel or key!r}: cannot write to state dir {self.path}: {exc.strerror}"
            ) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(blob)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):  # what failed is the error (a temp file left goes at the next tune)
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise StateDirError(
                    f"kernel {kernel or key!r}: cannot write state file {path}: {exc.strerror or exc}"
                ) from None
            raise
        try:
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:  # the new state is in place; only its survival of a power cut is in doubt
            log.warning("state file %s written, but its directory could not be synced (%s): a power cut may "
                        "bring back the previous checkpoint", path, exc.strerror or exc)
        return path

    def discard_temp_files(self, key: str) -> None:
        """Remove temp files a killed writer left; only the lock holder may call this."""
        for leftover in self.path.glob(self.file_for(key).name + ".*.tmp"):
            try:
                leftover.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StateDirError(
                    f"cannot remove {leftover.name}, left in state dir {self.path} by a killed writer: "
                    f"{exc.strerror or exc}"
                ) from None

    def supersede(self, key: str, why: str) -> Path:
        """Keep a valid but outdated state under a new name (for reading and carrying), so a new tune can start.

        The key's file stays in place until the new tune's first checkpoint
        replaces it: a crash in between leaves the old state to supersede again,
        never no state at all.
        """
        path = self.file_for(key)
        older = self.superseded_files(key)
        if older and _same_file(older[0], path):  # kept already, by a tune killed before its first checkpoint
            return older[0]
        stamp, first = _stamp(), 0
        if older:  # a clock stepped back must not file the newest state under the oldest name
            newest, attempt = _superseded_age(older[0])
            if stamp <= newest:
                stamp, first = newest, attempt + 1
        for attempt in range(first, first + 1000):  # a name of its own: an older superseded state is never overwritten
            target = path.with_name(f"{path.name}.superseded-{stamp}" + (f"-{attempt}" if attempt else ""))
            try:
                _keep_under(path, target)
            except FileExistsError:
                continue
            except OSError as exc:
                raise StateDirError(
                    f"cannot keep outdated state file {path} as {target.name}: {exc.strerror or exc}"
                ) from None
            log.warning("state file %s kept as %s: %s", path, target, why)
            return target
        raise StateDirError(f"cannot keep outdated state file {path}: every name for stamp {stamp} is taken")

    def reinstate(self, key: str, superseded: Path, blob: bytes) -> None:
        """Put one of the key's superseded states (`blob`, as read and checked) back as its state file: written in
        place as any checkpoint is (the file there now must be kept first, `supersede`), then its superseded name
        removed. A crash in between, or a name that will not go, leaves it under both names, which costs nothing."""
        self.write(key, blob)
        try:
            superseded.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("state file %s reinstated; its superseded copy %s stays (%s)", self.file_for(key),
                        superseded.name, exc.strerror or exc)
            return
        log.warning("state file %s reinstated from %s", self.file_for(key), superseded.name)

    def superseded_files(self, key: str) -> list[Path]:
        """The key's superseded states, newest first (`-10` after `-9` within one stamp, not before `-2`)."""
        return sorted(self.path.glob(self.file_for(key).name + ".superseded-*"), key=_superseded_age, reverse=True)

    def state_files(self) -> list[Path]:
        return sorted(self.path.glob("*" + STATE_SUFFIX))

    def set_aside_files(self) -> list[Path]:
        """Every state moved aside: quarantined (`.corrupt-*`, never read again) or superseded (`.superseded-*`,
        read when its key's tune starts over, for the results it carries). Each once, and none named as a state
        or lock file (`x.fsm.corrupt-1.fsm` is a state file, which `ls` lists and `clean` must leave alone)."""
        aside = {path for pattern in SET_ASIDE_PATTERNS for path in self.path.glob(pattern)}
        return sorted(path for path in aside if not path.name.endswith((STATE_SUFFIX, LOCK_SUFFIX)))

    def remove_set_aside(self, path: Path) -> bool:
        """Delete one set-aside state file; False, deleting nothing, when its key is being tuned right now.

        A superseded file goes only under its key's lock, as a tune takes it: a
        tune starting over reads the key's superseded files for their results.
        """
        lock_path = _superseded_lock(path)
        if lock_path is None:
            self._unlink(path)
            return True
        lock = filelock.FileLock(str(lock_path))
        try:
            lock.acquire(timeout=PROBE_GRACE_S, poll_interval=PROBE_GRACE_S / 20)  # past an `ls` probing it
        except filelock.Timeout:
            return False
        except OSError as exc:
            raise StateDirError(f"cannot lock {lock.lock_file} to remove {path}: {exc.strerror or exc}") from None
        try:
            self._unlink(path)
        finally:
            lock.release()
        return True

    @staticmethod
    def is_directory(path: Path) -> bool:
        """Whether `path` is a directory itself, not a link to one: a quarantine moves aside whatever stood at a
        state file's name, a directory too, and `clean` deletes files only (a link goes, never what it points to)."""
        try:
            return stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            return False

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot remove {path}: {exc.strerror or exc}") from None

    def resolve(self, key_or_file: str) -> Path:
        """A path to a state file from a path, a file name in the store (with or without its suffix), or a key."""
        candidate = Path(key_or_file).expanduser()
        if _entry(candidate):
            return candidate
        listed = self.state_files()  # a directory named like a state file too, which `ls` lists as unreadable
        for name in (key_or_file, key_or_file + STATE_SUFFIX):
            in_store = self.path / name
            if _entry(in_store) or in_store in listed:
                return in_store
        return self.file_for(key_or_file)


def _lock_trouble(path: Path, error: OSError) -> str:
    """Why a lock could not be made, by what stands at its path: something that is no lock file, which no tune
    holds and only its removal mends, or a lock file this process cannot open; else (nothing there, a dir it
    cannot search, a read-only mount) the state dir itself."""
    why = error.strerror or str(error)
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = None
    if mode is None or error.errno == errno.EROFS:
        return f"state dir is not writable ({why})"
    if not stat.S_ISREG(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else "no regular file"
        return f"{kind} stands in its place ({why}); no tune holds it: remove it"
    return f"the lock file cannot be opened ({why}); make it writable, or remove it while no tune of the key runs"


def _entry(path: Path) -> bool:
    """Whether `path` names something that may be a state file: a file, or what stands in one's place (a FIFO,
    a socket, a symbolic link to nothing), which reading then refuses by name; a directory is not one (a folder
    named as a kernel in the working directory must not hide its tune), unless `ls` lists it in the store."""
    return os.path.lexists(path) and not path.is_dir()


PROBE_GRACE_S = 0.05
"""How long a tune that will not wait (lock timeout 0) still waits: `fasta-sm ls` takes each lock to probe it."""


def _held_identity(lock: filelock.FileLock) -> tuple[int, int] | None:
    """(device, inode) of the file a held lock holds; None where filelock does not show its descriptor."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if not isinstance(fd, int):
        return None
    held = os.fstat(fd)
    return held.st_dev, held.st_ino


def is_wait(seconds: object) -> bool:
    """A lock timeout: a number of seconds ≥ 0 (inf waits for ever); not NaN, and not True, which is no number."""
    return isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0


_PASSING_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EMFILE", "ENFILE", "EIO", "EAGAIN", "EINTR", "ENOMEM", "ESTALE", "ETIMEDOUT")
    if hasattr(errno, name)
)
"""Read errors that say nothing of the file (out of descriptors, memory, a storage hiccup): it is left in place.
Any other (a directory, no permission, a link loop) would fail again at every tune: the file is set aside."""


def _decoded(path: Path, decode: Callable[..., Any]) -> Any:
    """`decode(bytes, source=path)` of the file at `path`: StateFileError for bytes no decoder takes or a file
    that is unreadable for good, StateDirError for one that cannot be read for now (it may be sound)."""
    for_now = f"cannot read state file {path} for now ({{}}); it is left as it is"
    try:
        return decode(read_regular(path, most=MOST_STATE_BYTES), source=str(path))
    except FileNotFoundError:
        raise
    except MemoryError:  # says nothing of the file, like ENOMEM: it may be sound
        raise StateDirError(for_now.format("out of memory")) from None
    except OSError as exc:
        if exc.errno in _PASSING_ERRNOS:
            raise StateDirError(for_now.format(exc.strerror or exc)) from None
        raise StateFileError(f"{path}: unreadable ({exc.strerror or exc})") from None


def _same_file(one: Path, other: Path) -> bool:
    """The same file (a hard link to it), or a copy of it byte for byte."""
    try:
        return os.path.samefile(one, other) or filecmp.cmp(one, other, shallow=False)
    except OSError:
        return False


def _keep_under(path: Path, target: Path) -> None:
    """A second name for `path`'s content: a hard link, or a copy where links are not supported; never over a file.

    A copy cut short (a full disk) is removed: left, it would pass for the key's newest superseded state.
    """
    try:
        os.link(path, target)
    except FileExistsError:
        raise
    except OSError:
        with open(path, "rb") as source, open(target, "xb") as copy:
            try:
                shutil.copyfileobj(source, copy)
                copy.flush()
                os.fsync(copy.fileno())  # whole on disk before the new tune's first checkpoint replaces the original
            except BaseException:
                with contextlib.suppress(OSError):  # closed first: Windows removes no open file
                    copy.close()
                with contextlib.suppress(OSError):
                    os.unlink(target)
                raise


def is_superseded(path: Path) -> bool:
    """Whether `path` names a superseded state (`<stem>.fsm.superseded-<stamp>`), not a quarantined one."""
    return _superseded_lock(path) is not None


def _superseded_lock(path: Path) -> Path | None:
    """The lock file of the key whose superseded state `path` is; None if it is none (a quarantined file)."""
    stem, superseded, _ = path.name.partition(f"{STATE_SUFFIX}.superseded-")
    return path.with_name(stem + LOCK_SUFFIX) if superseded else None


def _superseded_age(path: Path) -> tuple[str, int]:
    """Where a superseded file stands among its key's: its name's stamp, then its `-N`."""
    stamp, _, attempt = path.name.rpartition(".superseded-")[2].partition("-")
    return stamp, int(attempt) if attempt.isdecimal() else 0


def _stamp() -> str:
    """A UTC timestamp for file names, to the microsecond (never rounded up into the next second)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")


def _lock_held(lock_path: Path) -> bool | None:
    """Whether some process holds the lock file at `lock_path` right now, probed through a read-only descriptor;
    None when it cannot be opened at all."""
    if fcntl is None:
        return _is_locked_by_filelock(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a named pipe must not block
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _is_locked_by_filelock(lock_path: Path) -> bool | None:
    """The probe where there is no `fcntl` (Windows): take the lock and give it back; it needs write access."""
    if not lock_path.exists():
        return False
    lock = filelock.FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        return True
    except OSError:
        return None
    lock.release()
    return False
