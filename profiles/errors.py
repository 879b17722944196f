"""Exception tree of the ``profiles`` package.

::

    ProfileError
    ├── ProfileNotFoundError     no profile or artifact file at that name or path
    └── ProfileFormatError       a file that is not valid JSON or does not match its schema
        └── SchemaVersionError   a schema_version this build cannot read or upgrade
"""

from __future__ import annotations


class ProfileError(Exception):
    """Base class of every error raised by :mod:`profiles`."""


class ProfileNotFoundError(ProfileError):
    """No device profile or artifact at the given name or path."""


class ProfileFormatError(ProfileError, ValueError):
    """The file is not valid JSON or does not match its schema."""


class SchemaVersionError(ProfileFormatError):
    """The file's schema_version is newer than this build, or too old to upgrade."""
