"""Find a gymnasium env id wherever a package registers it, as users write it elsewhere.

gymnasium 1.x loads no plugins: `gymnasium.make("FetchReach-v4")` fails until something has imported
gymnasium_robotics, which registers its envs on import. `task.env_id` takes three forms:
- an id gymnasium already knows (`Pendulum-v1`, `HalfCheetah-v5`, `robotrl/PandaReach-v0`);
- an id one of ENV_PACKAGES registers (`FetchReach-v4`, `AdroitHandDoor-v1`, `HandManipulateBlock-v1`,
  `FrankaKitchen-v1`): that package is imported, where installed, and the id is found;
- `module:EnvId` for any package that registers envs when imported (gymnasium's own form).
An id found nowhere fails naming the closest ids that exist and the packages that were searched.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util

import gymnasium as gym

# Packages that register envs when imported, tried in order for an id gymnasium does not know.
# (import name, the extra or package that installs it)
ENV_PACKAGES = (("gymnasium_robotics", 'pip install -e ".[robotics]"'),)


def resolve_env_id(env_id: str) -> str:
    """`env_id` as gymnasium.make takes it, with the package that registers it imported. ValueError naming
    close matches where no registered id (after importing ENV_PACKAGES that are installed) is `env_id`."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"task.env_id must be a gymnasium env id such as 'Pendulum-v1', got {env_id!r}")
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        _import_registering(module, env_id)
        return _known(name, env_id, searched=[module])
    if env_id in gym.registry:
        return env_id
    searched = []
    for module, install in ENV_PACKAGES:
        if importlib.util.find_spec(module) is None:
            searched.append(f"{module} (not installed: {install})")
            continue
        importlib.import_module(module)
        searched.append(module)
        if env_id in gym.registry:
            return env_id
    return _known(env_id, env_id, searched)


def _import_registering(module: str, env_id: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ValueError(
            f"task.env_id={env_id!r}: module {module!r} (before the ':') cannot be imported: {err}"
        ) from err


def _known(name: str, env_id: str, searched: list[str]) -> str:
    if name in gym.registry:
        return name
    close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.6)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    where = f" (searched gymnasium's registry and {', '.join(searched)})" if searched else ""
    raise ValueError(f"task.env_id={env_id!r} is not a registered gymnasium env{where}{hint}")
