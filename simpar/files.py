"""Writing output files: to a temporary name in the same folder, then renamed, so
nothing is half-written. A symlink is written through to its target, a FIFO or device
(e.g. /dev/null) in place, never replaced; files land with the user's umask; folders
that are missing or not writable get one clear line first."""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile

from simpar.errors import SpecError


def check_writable(path: str, field: str = "output") -> str:
    """The file a write to `path` lands in (a symlink's target), or one line naming `field`
    when it cannot be written: call it before long work so a bad path fails at once."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real) or "."
    if os.path.isdir(real):
        raise SpecError(field, path, "is a folder; give a file name")
    if not os.path.isdir(folder):
        raise SpecError(field, path,
                        f"its folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK) or (os.path.exists(real) and not os.access(real, os.W_OK)):
        raise SpecError(field, path, "is not writable; choose another path")
    return real


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write, field: str = "output") -> None:
    """Call write(tmp_path) and rename the result to `path`; on failure nothing is left behind."""
    real = check_writable(path, field)
    if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
        write(real)  # a FIFO or a device: write into it, as a shell redirection would
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
