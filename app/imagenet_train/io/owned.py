"""Folders this process writes in, checked once the same way everywhere (the run directory, --cache-dir, the
resumable-upload sessions): a real directory of this user that no one else may write to.

Another local user who made such a folder first, or may write to it, could plant a link at a name we are about
to write (config.json, a key log) and have a job run as root overwrite or append to a file of their choosing,
or plant checkpoints and cached shards that we read back. A folder we make is 0700; a link at the folder's own
name is followed only when this user made the link. A folder that only the pod's own group may also write to is
accepted when IMAGENET_TRAIN_TRUST_GROUP=1 (`launch` sets it in a pod: the kubelet makes a volume group-writable
for the pod's fsGroup each time it mounts it, and no other user is in that group).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from imagenet_train.errors import ImagenetTrainError

TRUST_GROUP = "IMAGENET_TRAIN_TRUST_GROUP"
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _group_trusted(gid: int) -> bool:
    """Whether IMAGENET_TRAIN_TRUST_GROUP=1 and `gid` is one of this process's own groups."""
    return os.environ.get(TRUST_GROUP) == "1" and gid in (os.getegid(), *os.getgroups())


def ours(info: os.stat_result) -> bool:
    """Whether a file or folder belongs to this user and no one else may write to it."""
    others = info.st_mode & _OTHERS_WRITE
    if others == stat.S_IWGRP and _group_trusted(info.st_gid):
        others = 0
    return info.st_uid == os.geteuid() and not others


def _folder_info(path: str) -> os.stat_result:
    """The folder's status: its own, or, for a link this user made, its target's (a link of ours is our choice)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid():
        return os.stat(path)
    return info


def refusal(what: str, info: os.stat_result, why: str) -> ImagenetTrainError:
    """The one line for a folder that is not ours: who owns it, its mode, and what another user could do."""
    owner = "" if info.st_uid == os.geteuid() else f"owned by uid {info.st_uid}, "
    return ImagenetTrainError(
        f"{what}: {owner}mode {stat.filemode(info.st_mode)}; expected a directory of this user "
        f"that no one else may write to ({why}), refused"
    )


def owned_folder(path: str | os.PathLike, what: str = "", why: str = "another user could plant links in it") -> Path:
    """`path`, made (0700) when absent, when it is a directory of this user that no one else may write to; else
    one error line starting with `what` (the path by default). A path check for folders this process names itself
    (a link this user made is followed); io/atomic.py's `own_folder` is the descriptor check for a folder inside a
    directory that may come from elsewhere, where no link is followed."""
    what = what or os.fspath(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = _folder_info(os.fspath(path))
    except OSError as error:
        raise ImagenetTrainError(f"{what}: cannot make or read this folder ({error.strerror})") from None
    if stat.S_ISDIR(info.st_mode) and ours(info):
        return Path(path)
    raise refusal(what, info, why)


def private_folder(path: str, flag: str, why: str, mode: int = 0o755) -> str:
    """The folder to keep private files in: `path` when it is ours (see `owned_folder`; made with `mode`, and
    closed to that mode when it is ours with more); a 0700 folder of this user inside it when root owns it (a pod's
    emptyDir, /tmp); else one error line naming `flag` and the folder."""
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
        info = _folder_info(path)
        if stat.S_ISDIR(info.st_mode) and ours(info):
            if stat.S_IMODE(info.st_mode) & ~mode & 0o777:
                os.chmod(path, mode)  # made by an older version with the umask's mode: ours, so close it
            return path
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0:
            private = os.path.join(path, f"imagenet-train-{os.geteuid()}")
            with contextlib.suppress(FileExistsError):
                os.mkdir(private, 0o700)
            mine = os.lstat(private)
            if stat.S_ISDIR(mine.st_mode) and ours(mine):
                return private
            path, info = private, mine
    except OSError as error:
        raise ImagenetTrainError(f"{flag} {path}: cannot make or read ({error.strerror})") from None
    raise refusal(f"{flag} {path}", info, why)
