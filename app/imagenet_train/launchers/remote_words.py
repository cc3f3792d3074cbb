"""What may go into a script or onto a remote command line: no control characters, and no secret in argv.

A newline in a job name or a forwarded variable would start a new line of the sbatch script or of the remote
shell's command; a proxy URL's password on an ssh command line is visible in `ps` on both machines.
"""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*)(?P<password>:[^/@\s]*)?@")


def refuse_control(value: str, what: str) -> str:
    """`value` unchanged, or an error naming `what` when it holds a control character (newline, tab, escape)."""
    from imagenet_train.errors import ImagenetTrainError

    if CONTROL.search(value):
        raise ImagenetTrainError(f"{what}: control characters are not allowed, got {value[:60]!r}")
    return value


def holds_secret(value: str) -> bool:
    """Whether a variable's value carries a credential itself: a URL with user info, a key file's contents."""
    return bool(USERINFO.search(value)) or "-----BEGIN" in value or value.lstrip().startswith("{")


def redact(value: str) -> str:
    """`value` as a log may show it: a URL's password (or token-as-user) is ***, key contents are hidden."""
    if "-----BEGIN" in value or value.lstrip().startswith("{"):
        return "***"
    return USERINFO.sub(lambda m: f"{m['scheme']}{m['user'] + ':***' if m['password'] else '***'}@", value)
