"""ROS 2 name rules for topics (design.ros2.org topic_and_service_names, rmw_validate_full_topic_name) and
domain ids, and the DDS topic name a ROS 2 topic has on the wire."""

from __future__ import annotations

import re

MAX_TOPIC_LENGTH = 255 - 8  # rmw's RMW_TOPIC_MAX_NAME_LENGTH: 8 characters are kept for prefixes
MAX_DOMAIN_ID = 232  # the largest id whose RTPS ports (7400 + 250 * id + offsets) fit in 16 bits
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def full_topic_name(topic: str) -> str:
    """The absolute ROS 2 name of `topic` (a relative name lives in the root namespace), or a ValueError
    naming the topic and the broken rule."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {topic!r}")
    name = topic if topic.startswith("/") else "/" + topic

    def bad(rule: str) -> ValueError:
        return ValueError(f"invalid ROS 2 topic name {topic!r}: {rule}")

    if topic in ("", "/"):
        raise bad("it names no topic")
    if topic.startswith("~") or "{" in topic:
        raise bad("private (~) names and substitutions ({...}) need a node; give the full name")
    if name.endswith("/"):
        raise bad("it must not end with '/'")
    if "//" in name:
        raise bad("it must not contain '//'")
    for token in name[1:].split("/"):
        if not _TOKEN.fullmatch(token):
            if token[:1].isdigit():
                raise bad(f"the part {token!r} starts with a digit")
            raise bad(f"the part {token!r} may hold only letters, digits and '_'")
    if len(name) > MAX_TOPIC_LENGTH:
        raise bad(f"it is {len(name)} characters long, at most {MAX_TOPIC_LENGTH} are allowed")
    return name


def topic_for(template: str, name: str, key: str) -> str:
    """`template` (a topic with the placeholder {name}, as /camera/{name}/image_raw) for `name`; a template with
    any other placeholder raises ValueError naming config `key`."""
    try:
        return template.format(name=name)
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"{key} {template!r} may hold only the placeholder {{name}} ({error!r})") from None


def dds_topic_name(topic: str) -> str:
    """The DDS topic of a ROS 2 topic: `/joint_states` -> `rt/joint_states` (ROS topics carry `rt`)."""
    return "rt" + full_topic_name(topic)


def check_domain_id(domain_id: int) -> int:
    if isinstance(domain_id, bool) or not isinstance(domain_id, int) or not 0 <= domain_id <= MAX_DOMAIN_ID:
        raise ValueError(f"ROS 2 domain id must be an integer in 0..{MAX_DOMAIN_ID}, got {domain_id!r}")
    return domain_id
