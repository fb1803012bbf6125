"""The lock a run holds on its checkpoint folder (no torch here: the launcher takes it
before torchrun)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from simpar.errors import SpecError
from simpar.files import make_folder

LOCK_FILE = ".lock"
# Set by `execpar launch`, which holds the folder's lock for the whole job: its ranks do
# not take it again.
LOCK_HELD_ENV = "EXECPAR_CHECKPOINT_LOCKED"


def lock(folder: str):
    """An exclusive lock on the checkpoint folder (kept while the returned file stays open), or a
    one-line error naming who holds it: two runs writing one folder would interleave their steps."""
    import fcntl

    make_folder(folder, "--checkpoint-dir")
    try:
        f = open(Path(folder) / LOCK_FILE, "a+")  # noqa: SIM115 (held open for the run)
    except OSError as exc:
        raise SpecError("--checkpoint-dir", folder,
                        f"cannot be written ({exc.strerror}); choose another folder") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise SpecError(
            "--checkpoint-dir", folder,
            f"is in use by another run ({holder}); give each run its own folder, or wait for that "
            "one to end") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}")
    f.flush()
    return f
