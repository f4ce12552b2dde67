"""Atomic saving of one file or a set of files: :func:`atomic_files`.

Every writer of opgraph goes through :func:`atomic_files`: the .cg file set
(four files), JSON, ONNX, GraphML, the pickles, the drawings and
``opgraph run -o``. This module sits in ``core``, below every layer, because
``io``, ``viz`` (a layer under ``io``) and the ``cli`` use it.

What is guaranteed
------------------
*All files appear together or none changes*, for every failure that the
process lives through:

* **Staging.** Each file is written under a fresh name ``<name>.<random>.tmp``
  in its target's directory, flushed and fsynced. Nothing that exists is
  touched before every file of the set is complete. A target that is a
  directory is refused (:class:`IsADirectoryError`) before the ``with`` block
  runs.
* **Commit.** For a set of several files, each existing target is first
  hard-linked to a backup name ``<name>.<random>.old`` (moved there on file
  systems without hard links) and the directory is fsynced; then each
  temporary is renamed over its target (:func:`os.replace`). If any rename
  fails, every backup is renamed back over its target and the targets that
  did not exist before are removed. After the last rename the directory is
  fsynced and the backups are deleted. A single file needs no backup: one
  rename is atomic.
* **Any exception**, from the ``with`` block, a full disk at any byte, a
  failing fsync or rename, a directory in the way, ``KeyboardInterrupt`` or
  another :class:`BaseException`, leaves the previous files byte for byte as
  they were, and no temporary or backup file. (An error from the directory
  fsync *after* the last rename is raised although the new files are in
  place: their durability is what failed. If even putting a backup back
  fails, that backup is kept, since it is the only copy of the old file.)
* **Ctrl-C.** In the main thread, ``KeyboardInterrupt`` (a Python SIGINT
  handler) is held back while the temporaries are created, while the set is
  committed and while a failed save is cleaned up, and raised once that step
  is over; so a second Ctrl-C cannot leave litter or a mixed set behind. Other
  threads never receive it (Python runs signal handlers in the main thread).
* **Errors name the target.** An :class:`OSError` of the save (creating,
  writing, syncing or renaming a temporary) is raised again as the same
  OSError subclass with the same errno, whose ``filename`` is the path as the
  caller gave it and whose ``strerror`` says what failed and why (``no such
  directory ...``, ``cannot create it in DIR: Permission denied``, ``Read-only
  file system`` ...); the temporary's name is only in the chained original
  (``__cause__``).
* **Threads.** Within one process, commits run one at a time, so two threads
  saving the same set leave one of the two sets, never a mix. Separate
  processes saving the same set are not coordinated.
* **Permissions.** A new file gets the mode a plain :func:`open` would give
  it: the temporary is created with mode ``0o666`` and the kernel takes the
  umask (and any default ACL) off it, so the umask is never read or changed.
  A file that replaces an existing regular file keeps that file's permission
  bits, as rewriting it in place would; it belongs to the user who saves. A
  symbolic link at a target is replaced by the file, not followed.

The remaining window
--------------------
The renames of a set are separate system calls. If the process is killed
(``kill -9``) or the machine loses power between the first and the last of
them, the set may be mixed, and the directory then holds complete copies of
both versions to recover from: each ``<name>.<random>.old`` is the previous
``<name>`` (to go back, rename each over its ``<name>``) and each
``<name>.<random>.tmp`` is a new file not yet renamed (to go forward, rename
each over its ``<name>`` and delete the ``.old`` files). A save killed while it
writes leaves only ``.tmp`` files and the old set. These leftovers of a dead
process are never deleted automatically (another process may be saving in
the same directory at that moment); delete them once no save is running.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_files([os.path.join(d, "a.bin"), os.path.join(d, "b.bin")]) as (a, b):
    ...     _ = a.write(b"hello")
    ...     _ = b.write(b"world")
    >>> sorted(os.listdir(d)), open(os.path.join(d, "b.bin"), "rb").read()
    (['a.bin', 'b.bin'], b'world')
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import stat
import threading
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

TEMP_SUFFIX = ".tmp"
BACKUP_SUFFIX = ".old"

# One commit at a time per process: two threads saving the same set cannot interleave their renames.
_COMMIT_LOCK = threading.Lock()
# O_EXCL makes each name ours alone; 0o666 (given at os.open) lets the kernel apply umask and default ACLs.
_CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
# Errors of a directory fsync that mean "this file system or OS cannot do it", not "the disk failed".
_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.EBADF, errno.EACCES, errno.EPERM,
                      getattr(errno, "ENOTSUP", errno.EINVAL), getattr(errno, "EOPNOTSUPP", errno.EINVAL)}


@contextlib.contextmanager
def atomic_files(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[BinaryIO]]:
    """Open temporary files for ``paths``; rename them all into place if the block succeeds.

    See the module docstring for exactly what is guaranteed. The files are
    binary, opened for writing, one per path in order.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with atomic_files([p]) as (f,):
    ...     _ = f.write(b"old")
    >>> try:
    ...     with atomic_files([p]) as (f,):
    ...         _ = f.write(b"new, but")
    ...         raise RuntimeError("the writer failed")
    ... except RuntimeError:
    ...     pass
    >>> open(p, "rb").read(), os.listdir(os.path.dirname(p))
    (b'old', ['x.bin'])
    """
    given = [os.fspath(p) for p in paths]
    finals = [os.path.abspath(p) for p in given]
    if len(set(finals)) != len(finals):
        raise ValueError(f"atomic_files: a path is given twice: {finals}")
    modes = [_existing_mode(final, shown) for final, shown in zip(finals, given, strict=True)]
    staged: list[tuple[BinaryIO, str]] = []
    try:
        try:
            with _interrupts_held():
                for final, mode in zip(finals, modes, strict=True):
                    staged.append(_create_temp(final, mode))
        except OSError as exc:
            raise _target_error(exc, given[len(staged)], finals[len(staged)], "cannot create it") from exc
        try:
            yield [f for f, _ in staged]
        except OSError as exc:  # the writer's own errors; ours only when they name a temporary or have no name
            temps = [tmp for _, tmp in staged]
            if exc.filename in temps:
                i = temps.index(exc.filename)
                raise _target_error(exc, given[i], finals[i], "writing it failed") from exc
            if exc.filename is None and exc.errno in _DISK_ERRNOS:
                raise _target_error(exc, " and ".join(given), finals[0], "writing it failed") from exc
            raise
        for i, (f, _) in enumerate(staged):
            try:
                f.flush()
                os.fsync(f.fileno())
                f.close()
            except OSError as exc:
                raise _target_error(exc, given[i], finals[i], "writing it failed") from exc
        _commit([tmp for _, tmp in staged], finals, given)
    except BaseException:
        with _interrupts_held():
            _discard(staged)
        raise


# Errors of writing a file that are the disk's (not the writer's): reported as failures to save the target.
_DISK_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _target_error(exc: OSError, shown: str, final: str, action: str) -> OSError:
    """``exc`` (naming a temporary, or nothing) restated for the target path the caller gave.

    The result has ``exc``'s errno, so it is the same OSError subclass (PermissionError, ...), and
    ``filename`` is ``shown``; the temporary stays in the chained original (``__cause__``) only.

    >>> e = _target_error(PermissionError(errno.EACCES, "Permission denied", "/d/o.json.1a2b.tmp"),
    ...                   "o.json", "/d/o.json", "cannot create it")
    >>> type(e).__name__, e.filename, e.strerror
    ('PermissionError', 'o.json', 'cannot create it in /d: Permission denied')
    """
    directory = os.path.dirname(final)
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOENT and not os.path.isdir(directory):
        detail = f"no such directory {directory}"
    elif exc.errno == errno.EISDIR:
        detail = "cannot save over a directory"
    elif exc.errno == errno.ENOTDIR:
        detail = f"{action}: a part of {directory} is not a directory"
    elif action == "cannot create it":
        detail = f"{action} in {directory}: {reason}"
    else:
        detail = f"{action}: {reason}"
    new = OSError(exc.errno, detail, shown) if exc.errno is not None else OSError(detail)
    if exc.errno is None:
        new.filename = shown
    return new


def _existing_mode(final: str, shown: str) -> int | None:
    """Permission bits to keep from the current target (None: a new file); refuse a directory."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. a file in the path where a directory should be
        raise _target_error(exc, shown, final, "cannot save it") from exc
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "cannot save over a directory", shown)
    return stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None


def _fresh_name(final: str, suffix: str) -> str:
    return f"{final}.{secrets.token_hex(4)}{suffix}"


def _create_temp(final: str, mode: int | None) -> tuple[BinaryIO, str]:
    for _ in range(100):
        tmp = _fresh_name(final, TEMP_SUFFIX)
        try:
            fd = os.open(tmp, _CREATE_FLAGS, 0o666)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, "no unused temporary name", final)
    try:
        if mode is not None:
            # A file system without Unix permissions refuses; the umask-made mode is then all we can give.
            with contextlib.suppress(OSError):
                if hasattr(os, "fchmod"):
                    os.fchmod(fd, mode)
                else:
                    os.chmod(tmp, mode)
        return os.fdopen(fd, "wb"), tmp
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise


def _discard(staged: list[tuple[BinaryIO, str]]) -> None:
    """Close and delete the temporaries (those a commit already renamed are gone)."""
    for f, tmp in staged:
        # close() flushes, which fails again on a full disk (the descriptor is closed all the same); the
        # exception that brought us here is the one to report.
        with contextlib.suppress(BaseException):
            f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _commit(temps: list[str], finals: list[str], given: list[str]) -> None:
    dirs = list(dict.fromkeys(os.path.dirname(final) for final in finals))
    undoable = len(finals) > 1
    with _COMMIT_LOCK, _interrupts_held():
        backups: list[str | None] = [None] * len(finals)
        i = 0
        try:
            if undoable:
                for i, final in enumerate(finals):
                    backups[i] = _backup(final)
                _fsync_dirs(dirs)  # the backups survive a power cut in the middle of the renames
            for i in range(len(finals)):  # i: the target a failed rename names
                os.replace(temps[i], finals[i])
        except BaseException as exc:
            if undoable:
                _roll_back(temps, finals, backups)
            if isinstance(exc, OSError):
                raise _target_error(exc, given[i], finals[i], "cannot replace it") from exc
            raise
        try:
            _fsync_dirs(dirs)
        finally:
            for backup in backups:
                if backup is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(backup)


def _backup(final: str) -> str | None:
    """A second name for the current ``final`` (None when there is none), made before any rename."""
    for _ in range(100):
        backup = _fresh_name(final, BACKUP_SUFFIX)
        try:
            os.link(final, backup, follow_symlinks=False)
            return backup
        except FileExistsError:
            continue
        except FileNotFoundError:
            return None
        except (OSError, NotImplementedError):
            # No hard links here (FAT, some network file systems; or a directory appeared): move it aside.
            try:
                st = os.lstat(final)
            except FileNotFoundError:
                return None
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "cannot save over a directory", final) from None
            if os.path.lexists(backup):
                continue
            os.rename(final, backup)
            return backup
    raise FileExistsError(errno.EEXIST, "no unused backup name", final)


def _roll_back(temps: list[str], finals: list[str], backups: list[str | None]) -> None:
    """Put the previous set back whatever the renames did (decided from the files, not from counters)."""
    for tmp, final, backup in zip(temps, finals, backups, strict=True):
        with contextlib.suppress(OSError):
            if backup is not None:
                try:
                    same = os.path.samestat(os.lstat(backup), os.lstat(final))
                except FileNotFoundError:
                    same = False
                if same:  # never replaced; rename(2) of two links to one file would keep both names
                    os.unlink(backup)
                else:
                    os.replace(backup, final)
            elif not os.path.lexists(tmp):
                os.unlink(final)  # renamed in, but there was no previous file to keep
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _fsync_dirs(dirs: list[str]) -> None:
    """Make the renames in ``dirs`` durable, where the OS can open and fsync a directory."""
    if os.name == "nt":
        return
    for d in dirs:
        try:
            fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in _FSYNC_UNSUPPORTED:
                raise
        finally:
            os.close(fd)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold back SIGINT's Python handler (KeyboardInterrupt) during the block; call it afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers only ever run in the main thread
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL or a handler set outside Python: nothing raises here
        yield
        return
    caught: list[tuple[int, Any]] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    except ValueError:  # not the main interpreter: handlers cannot be changed here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(*caught[0])
