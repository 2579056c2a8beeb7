"""A long-running front end's own temporary directory (`specasr app`'s Gradio files, `specasr
serve`'s uploads): named `<prefix><pid>-*` under the system's temporary directory, removed when
the process exits, and removed by the next start when the process was killed (SIGKILL, a
crash) before it could."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale(prefix: str, root: str | None = None) -> list[str]:
    """Removes this user's `<prefix><pid>-*` directories whose pid no longer runs; returns
    their paths."""
    owned = re.compile(rf"{re.escape(prefix)}(\d+)-")
    root = root or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            match = owned.match(entry.name)
            if not match or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
            pid = int(match[1])
            if pid != os.getpid() and not _alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def private_dir(prefix: str) -> str:
    """A fresh `<prefix><pid>-*` directory, removed at exit; stale ones are removed first."""
    remove_stale(prefix)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
