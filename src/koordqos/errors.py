"""The one exception tree of koordqos: each I/O boundary raises its own subclass."""

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class KoordQoSError(Exception):
    """Base of every error koordqos raises on purpose."""


class ConfigError(KoordQoSError):
    """Invalid flags, environment, feature gates or configuration files."""


class StartupError(KoordQoSError):
    """An essential component cannot start (e.g. its address is in use): the agent exits, no restart loop."""


class ProtocolError(KoordQoSError):
    """Malformed bytes or messages on a wire protocol (ttrpc, NRI mux, watch stream)."""


class TimeoutException(KoordQoSError):
    """An operation overran its deadline."""


class CgroupError(KoordQoSError):
    """A cgroup path or value that cannot be used (confinement violation, invalid value, I/O)."""


class PathEscapeError(CgroupError):
    """A path built from pod data would resolve outside the cgroup root."""


class KubeError(KoordQoSError):
    """Kubernetes API failures that are not retried transparently."""


class HookError(KoordQoSError):
    """A runtime hook failed; under the Fail policy the runtime call fails with it."""


class ModelError(KoordQoSError):
    """Pod, node or NodeSLO data that does not fit the model."""


class UnsafePathError(KoordQoSError):
    """A path refused when it was opened: it would leave its root or pass through a symlink."""


def detached(exc: E) -> E:
    """`exc` without its traceback and context, for keeping it after its except block: kept whole, it holds
    the frames that raised it, and through their locals usually itself (a reference cycle that only a full
    collection frees, and none once the agent's GC policy has frozen it)."""
    exc.__traceback__ = None
    exc.__context__ = None
    return exc
