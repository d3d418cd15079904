"""The optional libraries of the ROS 2 bridge, imported only when used, with an error that says what to install."""

from __future__ import annotations

import importlib

ROS_EXTRA_HINT = 'pip install "robotrl[ros]"'


def require_cyclonedds() -> None:
    """Raise an ImportError naming the `ros` extra when the Cyclone DDS binding is missing."""
    try:
        importlib.import_module("cyclonedds.idl")
    except ImportError as error:
        raise ImportError(
            f"the ROS 2 bridge needs the Cyclone DDS Python binding (cyclonedds): {ROS_EXTRA_HINT} ({error})"
        ) from error
