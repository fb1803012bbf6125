"""Reading input files and writing output files, with one clear line for a bad path.

Inputs are read as UTF-8 text (a binary file or a folder is named, not a traceback).
Outputs go to a temporary name in the same folder, then renamed, so nothing is
half-written. A symlink is written through to its target, a FIFO (once its reader is
there) or a device (e.g. /dev/null) in place, never replaced; files land with the
user's umask; output folders that cannot be written or made get one line before the
work starts."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
import time

from simpar.errors import SpecError


def read_text(path: str | os.PathLike, field: str, missing: str) -> str:
    """The text of the file at `path`, or one line naming `field`: `missing` says what to do when
    there is no such file; a folder, an unreadable or a binary file gets its own line."""
    if os.path.isdir(path):
        raise SpecError(field, str(path), "is a folder; give a file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise SpecError(field, str(path), "is not a regular file (a device or a FIFO); give a "
                        "file")
    if not os.path.isfile(path):
        raise SpecError(field, str(path), missing)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise SpecError(field, str(path), "is not a text file (UTF-8 YAML or JSON); "
                        "check the path") from None
    except OSError as exc:
        raise SpecError(field, str(path), f"cannot be read ({exc.strerror})") from None


def check_writable(path: str, field: str = "output") -> str:
    """The file a write to `path` lands in (a symlink's target), or one line naming `field`
    when it cannot be written: call it before long work so a bad path fails at once."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real) or "."
    if os.path.isdir(real):
        raise SpecError(field, path, "is a folder; give a file name")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise SpecError(field, path, f"{folder} is a file, not a folder; choose another path")
    if not os.path.isdir(folder):
        raise SpecError(field, path,
                        f"its folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK) or (os.path.exists(real) and not os.access(real, os.W_OK)):
        raise SpecError(field, path, "is not writable; choose another path")
    return real


def check_folder(path: str, field: str) -> None:
    """One line naming `field` unless `path` is a folder that can be written to, or one that can
    be made: call it before long work. A probe folder is made and removed in the nearest existing
    folder, since permission bits do not say whether e.g. /proc takes new entries."""
    if not path:
        raise SpecError(field, path, "give a folder name")
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isdir(real):
        raise SpecError(field, path, "is a file; give a folder")
    ancestor = real
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise SpecError(field, path, f"{ancestor} is a file, not a folder; choose another path")
    try:
        os.rmdir(tempfile.mkdtemp(dir=ancestor))
    except OSError as exc:
        raise SpecError(field, path, f"cannot be written ({exc.strerror}); choose another "
                        "path") from None


def make_folder(path: str, field: str) -> None:
    """Make the output folder `path` (and its parents), or one line naming `field`."""
    check_folder(path, field)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SpecError(field, path, f"cannot be made ({exc.strerror}); choose another "
                        "path") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write, field: str = "output") -> None:
    """Call write(tmp_path) and rename the result to `path`; on failure nothing is left behind,
    and a write the system refuses (a full disk, a folder such as /proc that takes no new files)
    is one line naming `field`."""
    real = check_writable(path, field)
    try:
        _write_then_rename(real, path, write, field)
    except OSError as exc:
        raise SpecError(field, path, f"cannot be written ({exc.strerror or exc}); choose "
                        "another path") from None


def _write_then_rename(real: str, path: str, write, field: str) -> None:
    if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
        # a FIFO or a device: write into it, as a shell redirection would
        with _reader_of(real, path, field):
            write(real)
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), suffix=os.path.splitext(real)[1])
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes it private; an output file follows the umask
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# How long a write into a FIFO waits for its reader to open it before giving up.
FIFO_READER_WAIT_S = 1.0


@contextlib.contextmanager
def _reader_of(real: str, path: str, field: str):
    """Where `real` is a FIFO, make sure a reader is there instead of waiting for one forever:
    open a write end without blocking (it fails while nobody reads; retried for
    FIFO_READER_WAIT_S) and hold it while the caller writes, so the reader sees one stream."""
    if not stat.S_ISFIFO(os.stat(real).st_mode):
        yield
        return
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader (yet)
            if time.monotonic() > deadline:
                raise SpecError(field, path, "is a FIFO that nobody reads; start its reader "
                                "first (e.g. `cat FIFO > trace.json &`)") from None
            time.sleep(0.02)
    try:
        yield
    finally:
        os.close(fd)


def write_text(path: str, text: str, field: str = "output") -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write, field)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def strict_json(data, indent: int | None = 1) -> str:
    """JSON every parser reads: an infinite or undefined number (an MTBF without failures,
    a rate over no time) is null, where json.dumps would write Infinity or NaN."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)


def write_json(path: str, data, field: str = "output") -> None:
    write_text(path, strict_json(data), field)
