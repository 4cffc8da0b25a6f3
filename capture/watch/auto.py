"""The auto rule: poll where inotify cannot see the writes.

inotify reports only changes made through the local kernel. On network and parallel file
systems (NFS, Lustre, GPFS, CIFS, CephFS, ...) a writer on another host produces no events, and
FUSE file systems deliver them only if the FUSE server implements notifications. So the rule
is: poll when the directory (or its nearest existing parent) sits on one of those, or when the
user says so (``--poll`` / ``LAYERWATCH_POLL=1``); use inotify otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

NETWORK_FS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "glusterfs",
        "beegfs", "panfs", "afs", "9p", "ocfs2", "gfs2", "wekafs", "orangefs", "pvfs2",
    }
)  # fmt: skip
"""File-system types (``/proc/mounts`` third column) on which we poll."""

POLL_ENV = "LAYERWATCH_POLL"
"""``1`` forces polling, ``0`` forces inotify, unset = the rule above."""


def nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (a dump dir may not exist yet)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def fs_type(path: Path, mounts: str = "/proc/mounts") -> str:
    """Type of the file system holding ``path`` (longest matching mount point), or ``""``."""
    real = os.path.realpath(nearest_existing(path))
    best, best_type = "", ""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, best_type = mount, fields[2]
    except OSError:
        return ""
    return best_type


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS or fstype.startswith("fuse")


def should_poll(path: Path, requested: bool | None = None) -> tuple[bool, str]:
    """Decide between inotify and polling for ``path``; returns (poll?, why) for the notes."""
    if requested:
        return True, "polling (--poll)"
    env = os.environ.get(POLL_ENV, "").strip()
    if env in ("1", "0"):
        return env == "1", f"{'polling' if env == '1' else 'inotify'} ({POLL_ENV}={env})"
    fstype = fs_type(path)
    if is_network_fs(fstype):
        return True, f"polling ({fstype} file system: inotify misses writes from other hosts)"
    return False, f"inotify ({fstype or 'local'} file system)"
