"""The error every volume operation raises: a kubelet reason plus a message for the user."""

from __future__ import annotations

FAILED_MOUNT = "FailedMount"  # the event reason of a volume that cannot be set up
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"  # a mount a container cannot get


class VolumeError(Exception):
    """A volume could not be set up or mounted into a container.

    ``reason`` is what the kubelet reports (event reason or container waiting reason),
    ``message`` the text shown to the user, ``volume`` the pod volume concerned, if one.
    """

    def __init__(self, reason: str, message: str, volume: str | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.volume = volume
