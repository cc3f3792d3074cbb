"""Settings, values and deployment files read as untrusted input: a YAML (or JSON) mapping, size-capped, with
YAML aliases refused."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from imagenet_train.errors import ImagenetTrainError

MAX_SETTINGS_BYTES = 1 << 20  # config, values and deployment files are a few KB


def read_mapping(path: str | Path, label: str) -> dict[str, Any]:
    """A YAML (or JSON) file holding a mapping; an empty file is {}. Errors name `label` (the flag) and the file.

    YAML aliases are refused: a few hundred bytes of nested aliases expand to gigabytes ("billion laughs").
    """
    import yaml

    loader, alias_error = _no_alias_loader()
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_SETTINGS_BYTES + 1)
    except OSError as error:
        raise ImagenetTrainError(f"{label} {path}: cannot read ({error.strerror})") from None
    if len(raw) > MAX_SETTINGS_BYTES:
        raise ImagenetTrainError(f"{label} {path}: more than {MAX_SETTINGS_BYTES} bytes; expected a settings file")
    try:
        values = yaml.load(raw.decode("utf-8"), Loader=loader)  # a SafeLoader that also refuses aliases
    except (yaml.YAMLError, ValueError, RecursionError) as error:  # ValueError: bad UTF-8, a 5000-digit int
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        if isinstance(error, alias_error):
            raise ImagenetTrainError(
                f"{label} {path}: a YAML alias (*name){where}; expected the values written out"
            ) from None
        raise ImagenetTrainError(f"{label} {path}: not valid YAML or JSON{where}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ImagenetTrainError(f"{label} {path}: expected a mapping, got {type(values).__name__}")
    return values


@functools.cache
def _no_alias_loader() -> tuple[type, type]:
    import yaml

    class AliasError(yaml.MarkedYAMLError):
        """A YAML alias, refused (marked with where it stands)."""

    class NoAliasLoader(yaml.SafeLoader):
        """yaml.SafeLoader that stops at the first alias instead of sharing (and later expanding) a node."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise AliasError(problem="alias", problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return NoAliasLoader, AliasError
