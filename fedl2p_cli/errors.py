"""User-facing errors: the CLI turns these into one line and a non-zero exit."""


class FedL2PError(Exception):
    """A problem the user can fix (bad input, missing data, broken artifact)."""


class ArtifactError(FedL2PError):
    """An artifact is missing, corrupted, or of the wrong kind."""


class DataError(FedL2PError):
    """A dataset cannot be found or read."""


from .core.config import ConfigError  # noqa: E402  (core raises it without importing this module)

USER_ERRORS = (FedL2PError, ConfigError)
