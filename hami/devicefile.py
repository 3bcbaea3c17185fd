"""Read HAMi's device-config YAML file (``--device-config``), the one file every component reads.

Owns the file I/O and its error messages; the parsing rules live in :func:`hami.settings.from_device_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from hami.settings import ConfigError, DeviceConfig, from_device_config


class DeviceConfigFileError(ValueError):
    """The device-config file cannot be read or holds a bad value; the message names flag and file."""


def load_device_config(path: str | Path | None) -> DeviceConfig:
    """The file's :class:`DeviceConfig`; HAMi's defaults when no path is given."""
    if not path:
        return DeviceConfig()
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise DeviceConfigFileError(f"--device-config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise DeviceConfigFileError(f"--device-config {path}: not valid YAML: {exc}") from exc
    if document is not None and not isinstance(document, Mapping):
        raise DeviceConfigFileError(
            f"--device-config {path}: the top level must be a mapping with key 'nvidia'"
        )
    try:
        return from_device_config(document)
    except ConfigError as exc:
        raise DeviceConfigFileError(f"--device-config {path}: {exc}") from exc
