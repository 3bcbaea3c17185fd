"""Read HAMi's device-config YAML file (``--device-config``), the one file every component reads.

Owns the file I/O and its error messages, for every service: :func:`read_device_document` (the parsed
document, for a reader that needs keys beyond :class:`~hami.settings.DeviceConfig`: the node agent) and
:func:`load_device_config` (the :class:`~hami.settings.DeviceConfig`, what the scheduler, the webhook and
the ``hami`` commands read). Errors are :class:`~hami.settings.ConfigError` and start with
``--device-config FILE:``. The parsing rules live in :func:`hami.settings.from_device_config`. Must not
import a service (it sits below them all).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hami.settings import ConfigError, DeviceConfig, from_device_config


def read_device_document(path: str | Path | None) -> Mapping[str, Any] | None:
    """The file's parsed document (``None`` when no path is given, or the file is empty)."""
    if not path:
        return None
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--device-config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--device-config {path}: not valid YAML: {exc}") from exc
    if document is not None and not isinstance(document, Mapping):
        raise ConfigError(f"--device-config {path}: the top level must be a mapping with key 'nvidia'")
    return document


def load_device_config(path: str | Path | None) -> DeviceConfig:
    """The file's :class:`DeviceConfig`; HAMi's defaults when no path is given."""
    document = read_device_document(path)
    try:
        return from_device_config(document)
    except ConfigError as exc:
        raise ConfigError(f"--device-config {path}: {exc}") from exc
