"""The on-disk episode dataset, the recorder over a real env, and Minari import/export (real files)."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest
import torch

from robotrl.core import durable
from robotrl.core.env import StepResult
from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import DatasetError, Episode, EpisodeDataset, EpisodeRecorder

SPEC = {"state": TensorSpec((4,)), "pixels_front": TensorSpec((3, 8, 6), torch.uint8)}
ACTION_DIM = 2


def make_episode(length: int, seed: int = 0, metadata: dict | None = None) -> Episode:
    gen = torch.Generator().manual_seed(seed)
    truncated = torch.zeros(length, dtype=torch.bool)
    truncated[-1] = True
    return Episode(
        obs={
            "state": torch.randn(length + 1, 4, generator=gen),
            "pixels_front": torch.randint(0, 256, (length + 1, 3, 8, 6), dtype=torch.uint8, generator=gen),
        },
        action=torch.rand(length, ACTION_DIM, generator=gen) * 2 - 1,
        reward=torch.randn(length, generator=gen),
        terminated=torch.zeros(length, dtype=torch.bool),
        truncated=truncated,
        success=torch.rand(length, generator=gen) > 0.7,
        intervention=torch.rand(length, generator=gen) > 0.5,
        metadata=metadata if metadata is not None else {"source": "teleop", "seed": str(seed)},
    )


def assert_episodes_equal(a: Episode, b: Episode) -> None:
    assert a.obs.keys() == b.obs.keys()
    for key in a.obs:
        assert a.obs[key].dtype == b.obs[key].dtype and torch.equal(a.obs[key], b.obs[key]), key
    for name in ("action", "reward", "terminated", "truncated", "success", "intervention"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert a.metadata == b.metadata


@pytest.fixture
def filled(tmp_path):
    ds = EpisodeDataset.create(tmp_path / "demos", SPEC, ACTION_DIM, {"task": "panda_reach"})
    episodes = [make_episode(n, seed=n) for n in (3, 7, 5)]
    for ep in episodes:
        ds.append(ep)
    return ds, episodes


# -- the format --------------------------------------------------------------------------------------------
def test_round_trip_is_bit_exact_and_the_index_describes_each_file(filled):
    ds, episodes = filled
    reopened = EpisodeDataset.open(ds.root)
    assert len(reopened) == 3 and reopened.num_steps == 15
    assert reopened.obs_spec == SPEC and reopened.action_dim == ACTION_DIM
    assert reopened.metadata == {"task": "panda_reach"}
    for original, loaded in zip(episodes, reopened.load_all(), strict=True):
        assert_episodes_equal(original, loaded)
    for original, loaded in zip(episodes, reopened, strict=True):
        assert_episodes_equal(original, loaded)
    assert_episodes_equal(episodes[-1], reopened.load(-1))

    index = json.loads((ds.root / "dataset.json").read_text())
    assert index["format"] == "robotrl.episode_dataset" and index["version"] == 1
    assert index["obs_spec"] == {
        "state": {"shape": [4], "dtype": "float32"},
        "pixels_front": {"shape": [3, 8, 6], "dtype": "uint8"},
    }
    for entry, ep in zip(index["episodes"], episodes, strict=True):
        data = (ds.root / entry["file"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["length"] == len(ep) and entry["success"] == ep.success_any
        assert entry["interventions"] == int(ep.intervention.sum())
        # readable without robotrl: a plain safetensors header (JSON), the episode metadata inside it
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        assert header["__metadata__"] == ep.metadata
        assert header["obs.pixels_front"]["dtype"] == "U8" and header["intervention"]["dtype"] == "BOOL"
    assert [e.file for e in ds.entries] == [f"episodes/episode_00000{i}.safetensors" for i in range(3)]


def test_create_refuses_existing_data_and_reopens_only_a_matching_spec(filled, tmp_path):
    ds, _ = filled
    with pytest.raises(DatasetError, match="exist_ok"):
        EpisodeDataset.create(ds.root, SPEC, ACTION_DIM)
    again = EpisodeDataset.create(ds.root, SPEC, ACTION_DIM, {"task": "panda_reach"}, exist_ok=True)
    assert len(again) == 3
    again.append(make_episode(2, seed=9))
    assert len(EpisodeDataset.open(ds.root)) == 4
    with pytest.raises(DatasetError, match=r"obs_spec\['state'\] differs") as err:
        EpisodeDataset.create(ds.root, {**SPEC, "state": TensorSpec((5,))}, ACTION_DIM, exist_ok=True)
    assert str(ds.root / "dataset.json") in str(err.value)
    with pytest.raises(DatasetError, match="action_dim differs"):
        EpisodeDataset.create(ds.root, SPEC, 3, exist_ok=True)
    with pytest.raises(DatasetError, match=r"metadata\['task'\] differs"):
        EpisodeDataset.create(ds.root, SPEC, ACTION_DIM, {"task": "panda_push"}, exist_ok=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="not an empty directory"):
        EpisodeDataset.create(tmp_path / "busy", SPEC, ACTION_DIM)
    with pytest.raises(ValueError, match=r"obs_spec\['state'\]: dtype torch.complex64"):
        EpisodeDataset.create(tmp_path / "new", {"state": TensorSpec((2,), torch.complex64)}, ACTION_DIM)
    with pytest.raises(ValueError, match="action_dim"):
        EpisodeDataset.create(tmp_path / "new", SPEC, 0)


def test_append_rejects_episodes_that_do_not_fit_naming_the_field(tmp_path):
    ds = EpisodeDataset.create(tmp_path / "d", SPEC, ACTION_DIM)
    ep = make_episode(4)
    ep.obs["state"] = torch.zeros(5, 3)
    with pytest.raises(ValueError, match=r"obs\['state'\]: expected shape \[T\+1\]\[4\]"):
        ds.append(ep)
    ep = make_episode(4)
    ep.obs["pixels_front"] = ep.obs["pixels_front"].float()
    with pytest.raises(ValueError, match=r"obs\['pixels_front'\]: expected dtype torch.uint8"):
        ds.append(ep)
    ep = make_episode(4)
    del ep.obs["state"]
    with pytest.raises(ValueError, match=r"missing \['state'\]"):
        ds.append(ep)
    ep = make_episode(4)
    ep.action[2, 1] = 1.5
    with pytest.raises(ValueError, match=r"action: outside \[-1, 1\] at step 2"):
        ds.append(ep)
    ep = make_episode(4)
    ep.reward[1] = float("nan")
    with pytest.raises(ValueError, match="reward: non-finite value at step 1"):
        ds.append(ep)
    ep = make_episode(4)
    ep.terminated[1] = True
    with pytest.raises(ValueError, match="ends at step 1 before its last step 3"):
        ds.append(ep)
    ep = make_episode(4)
    ep.success = ep.success.float()
    with pytest.raises(ValueError, match=r"success: expected dtype torch\.bool"):
        ds.append(ep)
    with pytest.raises(ValueError, match=r"metadata\['seed'\]"):
        ds.append(make_episode(4, metadata={"seed": 3}))
    with pytest.raises(ValueError, match=r"expected action_dim 2"):
        ds.append(Episode(**{**make_episode(4).__dict__, "action": torch.zeros(4, 3)}))
    assert len(ds) == 0 and not list((ds.root / "episodes").iterdir())


def test_an_append_never_reuses_the_file_of_an_episode_still_on_disk(filled):
    ds, _ = filled
    index = json.loads((ds.root / "dataset.json").read_text())
    del index["episodes"][1]  # an episode taken out of the index by hand: only listed files count
    (ds.root / "dataset.json").write_text(json.dumps(index))
    ds = EpisodeDataset.open(ds.root)
    path = ds.append(make_episode(4, seed=4))
    assert path.name == "episode_000003.safetensors"  # not episode_000002, which the index still lists
    assert len(EpisodeDataset.open(ds.root)) == 3 and len(ds.load_all()) == 3


def test_demos_load_all_or_nothing_and_only_into_the_task_and_dtypes_they_were_recorded_for(filled, tmp_path):
    from robotrl.data.replay import ReplayBuffer
    from robotrl.hil.setup import load_demos

    ds, _ = filled
    offline = ReplayBuffer(SPEC, ACTION_DIM, 100)
    with pytest.raises(ValueError, match="recorded on task 'panda_reach', this run trains 'panda_push'"):
        load_demos([str(ds.root)], offline, SPEC, ACTION_DIM, task="panda_push")
    as_floats = {**SPEC, "pixels_front": TensorSpec((3, 8, 6))}  # float images: a buffer would cast silently
    with pytest.raises(ValueError, match=r"'pixels_front' has dtype torch\.uint8, the env's torch\.float32"):
        load_demos([str(ds.root)], ReplayBuffer(as_floats, ACTION_DIM, 100), as_floats, ACTION_DIM)
    (ds.root / "episodes" / "episode_000002.safetensors").write_bytes(b"torn")
    good = EpisodeDataset.create(tmp_path / "good", SPEC, ACTION_DIM, {"task": "panda_reach"})
    good.append(make_episode(3, seed=9))
    with pytest.raises(Exception, match="episode_000002"):
        load_demos([str(good.root), str(ds.root)], offline, SPEC, ACTION_DIM, task="panda_reach")
    assert len(offline) == 0  # the good dataset before the bad one was not loaded either
    assert load_demos([str(good.root)], offline, SPEC, ACTION_DIM, task="panda_reach") == 3


# -- crashes and corruption ------------------------------------------------------------------------------
def test_the_index_is_written_last_so_a_crash_mid_append_keeps_the_previous_dataset(filled, monkeypatch):
    ds, episodes = filled
    replaced = []
    real_replace = os.replace

    def crash_on_index(src, dst):
        replaced.append(os.path.basename(dst))
        if os.path.basename(dst) == "dataset.json":
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "replace", crash_on_index)
    with pytest.raises(OSError, match="simulated crash"):
        ds.append(make_episode(6, seed=6))
    assert replaced == ["episode_000003.safetensors", "dataset.json"]  # the episode file, then the index
    assert len(ds) == 3  # the object agrees with the disk

    def crash_on_episode(src, dst):
        raise OSError("simulated crash")

    monkeypatch.setattr(durable.os, "replace", crash_on_episode)
    with pytest.raises(OSError):
        ds.append(make_episode(6, seed=6))
    monkeypatch.setattr(durable.os, "replace", real_replace)

    reopened = EpisodeDataset.open(ds.root)
    assert len(reopened) == 3 and reopened.num_steps == 15
    for original, loaded in zip(episodes, reopened.load_all(), strict=True):
        assert_episodes_equal(original, loaded)
    reopened.append(make_episode(2, seed=2))  # the orphan file of the crashed append is replaced
    assert_episodes_equal(make_episode(2, seed=2), EpisodeDataset.open(ds.root).load(3))


@pytest.mark.parametrize("damage", ["flip_byte", "truncate"])
def test_a_corrupt_or_truncated_file_raises_naming_it_and_load_all_returns_nothing(filled, damage):
    ds, _ = filled
    path = ds.root / "episodes" / "episode_000001.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "flip_byte":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))

    ds = EpisodeDataset.open(ds.root)
    assert_episodes_equal(ds.load(0), make_episode(3, seed=3))  # the intact ones still load
    with pytest.raises(DatasetError, match="checksum mismatch") as err:
        ds.load(1)
    assert err.value.path == path and str(path) in str(err.value)
    result = None
    with pytest.raises(DatasetError) as err:
        result = ds.load_all()
    assert result is None and str(path) in str(err.value)
    with pytest.raises(DatasetError, match=str(path)):
        list(ds)


def rewrite_with_checksum(ds: EpisodeDataset, position: int, tensors: dict) -> None:
    """Replace an episode file and fix up its checksum: the content checks must catch what is wrong."""
    from safetensors.torch import save

    data = save(tensors)
    (ds.root / ds.entries[position].file).write_bytes(data)
    index = json.loads((ds.root / "dataset.json").read_text())
    index["episodes"][position]["sha256"] = hashlib.sha256(data).hexdigest()
    (ds.root / "dataset.json").write_text(json.dumps(index))


def episode_tensors(ep: Episode) -> dict:
    tensors = {f"obs.{k}": v for k, v in ep.obs.items()}
    tensors.update({n: getattr(ep, n) for n in ("action", "reward", "terminated", "truncated", "success")})
    tensors["intervention"] = ep.intervention
    return tensors


def test_contents_are_checked_even_when_the_checksum_matches(filled):
    ds, episodes = filled
    path = ds.root / ds.entries[2].file
    tensors = episode_tensors(episodes[2])
    del tensors["reward"]
    rewrite_with_checksum(ds, 2, tensors)
    with pytest.raises(DatasetError, match="missing tensor 'reward'") as err:
        EpisodeDataset.open(ds.root).load(2)
    assert err.value.path == path

    tensors = episode_tensors(episodes[2])
    tensors["obs.state"] = torch.zeros(6, 5)
    rewrite_with_checksum(ds, 2, tensors)
    with pytest.raises(DatasetError, match=r"obs\['state'\]: expected shape") as err:
        EpisodeDataset.open(ds.root).load_all()
    assert err.value.path == path

    tensors = episode_tensors(make_episode(4, seed=5))
    rewrite_with_checksum(ds, 2, tensors)
    with pytest.raises(DatasetError, match="holds 4 steps, the index says 5"):
        EpisodeDataset.open(ds.root).load(2)

    tensors = episode_tensors(episodes[2])
    recorded = bool(tensors["success"].any())
    tensors["success"] = torch.full_like(tensors["success"], not recorded)  # the index says otherwise
    rewrite_with_checksum(ds, 2, tensors)
    with pytest.raises(DatasetError, match=f"success {not recorded} and .* the index says {recorded} and"):
        EpisodeDataset.open(ds.root).load(2)


def test_a_missing_or_damaged_index_or_episode_file_fails_open_naming_it(filled, tmp_path):
    ds, _ = filled
    with pytest.raises(DatasetError, match=r"no dataset index: .*nowhere does not exist") as err:
        EpisodeDataset.open(tmp_path / "nowhere")
    assert err.value.path == tmp_path / "nowhere" / "dataset.json"
    missing = ds.root / ds.entries[1].file
    missing.unlink()
    with pytest.raises(DatasetError, match="missing") as err:
        EpisodeDataset.open(ds.root)
    assert err.value.path == missing
    index_path = ds.root / "dataset.json"
    index_path.write_text(index_path.read_text()[:40])
    with pytest.raises(DatasetError, match="unreadable index") as err:
        EpisodeDataset.open(ds.root)
    assert err.value.path == index_path
    index_path.write_text(json.dumps({"format": "robotrl.episode_dataset", "version": 99}))
    with pytest.raises(DatasetError, match="version 99 is not supported"):
        EpisodeDataset.open(ds.root)


# -- recording -------------------------------------------------------------------------------------------
def test_recorder_cuts_a_real_env_into_episodes_at_the_time_limit(tmp_path):
    from robotrl.tasks import TASK_CONFIGS, make_env

    cfg = TASK_CONFIGS["panda_reach"](name="panda_reach", episode_steps=10)
    env = make_env(cfg, num_envs=2)
    try:
        obs = env.reset(seed=0)
        recorder = EpisodeRecorder(2, {"source": "policy", "task": "panda_reach"})
        recorder.start(obs)
        first_obs = [{k: v[e].clone() for k, v in obs.items()} for e in range(2)]
        actions, finished = [], []
        for t in range(25):
            action = torch.rand(2, env.action_dim) * 2 - 1
            result = env.step(action)
            actions.append(action)
            ended = recorder.step(action, result)
            for env_index, episode in zip(result.truncated.nonzero().flatten().tolist(), ended, strict=True):
                for key in obs:  # the last observation is the true final one, not the reset one
                    assert torch.equal(episode.obs[key][-1], result.next_obs[key][env_index])
                    assert torch.equal(episode.obs[key][0], first_obs[env_index][key])
                    first_obs[env_index][key] = result.obs[key][env_index].clone()
                start = t + 1 - len(episode)
                assert torch.equal(episode.action, torch.stack([a[env_index] for a in actions[start:]]))
                finished.append((t, env_index, episode))
    finally:
        env.close()

    assert [(t, e) for t, e, _ in finished] == [(9, 0), (9, 1), (19, 0), (19, 1)]
    for _, _, episode in finished:
        assert len(episode) == 10 and all(v.shape[0] == 11 for v in episode.obs.values())
        assert episode.truncated.tolist() == [False] * 9 + [True] and not episode.terminated.any()
        assert not episode.intervention.any() and episode.metadata == {"source": "policy", "task": "panda_reach"}
        episode.validate(env.obs_spec, env.action_dim)

    ds = EpisodeDataset.create(tmp_path / "rollouts", env.obs_spec, env.action_dim)
    for _, _, episode in finished:
        ds.append(episode)
    for (_, _, original), loaded in zip(finished, EpisodeDataset.open(ds.root).load_all(), strict=True):
        assert_episodes_equal(original, loaded)


def fake_step(obs_value: float, done: list[bool], intervened=None, executed=None) -> StepResult:
    num = len(done)
    return StepResult(
        obs={"state": torch.full((num, 2), -1.0)},
        next_obs={"state": torch.full((num, 2), obs_value)},
        reward=torch.ones(num),
        terminated=torch.tensor(done),
        truncated=torch.zeros(num, dtype=torch.bool),
        success=torch.tensor(done),
        intervened=intervened,
        action=executed,
    )


def test_recorder_keeps_the_executed_action_and_the_intervention_flags():
    recorder = EpisodeRecorder(2)
    recorder.start({"state": torch.zeros(2, 2)})
    policy = torch.full((2, 1), 0.5)
    operator = torch.tensor([[-0.25], [0.5]])
    assert recorder.step(policy, fake_step(1.0, [False, False], torch.tensor([True, False]), operator)) == []
    (episode,) = recorder.step(policy, fake_step(2.0, [True, False]))
    assert episode.action.flatten().tolist() == [-0.25, 0.5]
    assert episode.intervention.tolist() == [True, False] and episode.terminated.tolist() == [False, True]
    assert episode.obs["state"][:, 0].tolist() == [0.0, 1.0, 2.0] and episode.success_any
    (episode,) = recorder.step(policy, fake_step(3.0, [True, True]))[1:]
    assert len(episode) == 3 and episode.obs["state"][0, 0] == 0.0
    (episode, _) = recorder.step(policy, fake_step(4.0, [True, True]))
    assert episode.obs["state"][:, 0].tolist() == [-1.0, 4.0]  # began from the reset observation of step 3

    with pytest.raises(ValueError, match=r"action: expected finite values in \[-1, 1\]"):
        recorder.step(torch.full((2, 1), 2.0), fake_step(1.0, [False, False]))
    with pytest.raises(ValueError, match=r"result.next_obs\['state'\]: expected a \[2, ...\] tensor"):
        recorder.step(
            policy, StepResult(**{**fake_step(1.0, [False] * 2).__dict__, "next_obs": {"state": torch.ones(3, 2)}})
        )
    with pytest.raises(ValueError, match=r"result\.terminated: expected dtype torch\.bool"):
        recorder.step(policy, StepResult(**{**fake_step(1.0, [False] * 2).__dict__, "terminated": torch.zeros(2)}))
    (episode,) = recorder.step(policy, fake_step(5.0, [True, False]))  # rejected steps recorded nothing
    assert episode.obs["state"][:, 0].tolist() == [-1.0, 5.0]
    with pytest.raises(RuntimeError, match="before start"):
        EpisodeRecorder(1).step(policy[:1], fake_step(1.0, [False]))
    with pytest.raises(ValueError, match="num_envs"):
        EpisodeRecorder(0)


# -- Minari ----------------------------------------------------------------------------------------------
def test_minari_export_reads_back_with_minari_and_imports_unchanged(filled, tmp_path, monkeypatch):
    import minari

    from robotrl.data.minari_io import export_minari, import_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    ds, episodes = filled
    exported = export_minari(ds, "robotrl/demos-v0")
    assert exported.total_episodes == 3 and exported.total_steps == 15

    loaded = minari.load_dataset("robotrl/demos-v0")
    assert loaded.action_space.shape == (ACTION_DIM,) and float(loaded.action_space.low.min()) == -1.0
    for minari_episode, ep in zip(loaded.iterate_episodes(), episodes, strict=True):
        for key in SPEC:
            np.testing.assert_array_equal(minari_episode.observations[key], ep.obs[key].numpy())
        assert minari_episode.observations["pixels_front"].dtype == np.uint8
        np.testing.assert_array_equal(minari_episode.actions, ep.action.numpy())
        np.testing.assert_array_equal(minari_episode.rewards, ep.reward.numpy())
        np.testing.assert_array_equal(minari_episode.terminations, ep.terminated.numpy())
        np.testing.assert_array_equal(minari_episode.truncations, ep.truncated.numpy())
        np.testing.assert_array_equal(minari_episode.infos["success"][1:], ep.success.numpy())
        np.testing.assert_array_equal(minari_episode.infos["intervention"][1:], ep.intervention.numpy())

    back = import_minari("robotrl/demos-v0", tmp_path / "back")
    assert back.obs_spec == SPEC and back.action_dim == ACTION_DIM
    assert back.metadata == {"task": "panda_reach", "minari_dataset_id": "robotrl/demos-v0"}
    for original, reloaded in zip(episodes, EpisodeDataset.open(tmp_path / "back").load_all(), strict=True):
        assert_episodes_equal(original, reloaded)

    with pytest.raises(FileExistsError, match="exists already"):
        export_minari(ds, "robotrl/demos-v0")
    with pytest.raises(DatasetError, match="exist_ok"):
        import_minari("robotrl/demos-v0", tmp_path / "back")
    with pytest.raises(ValueError, match="Malformed dataset ID"):
        export_minari(ds, "no spaces allowed")
    with pytest.raises(ValueError, match="not a registered gymnasium id"):
        export_minari(ds, "robotrl/other-v0", env_id="NoSuchEnv-v9")
    with pytest.raises(FileNotFoundError, match="no Minari dataset"):
        import_minari("robotrl/absent-v0", tmp_path / "none")


def test_minari_data_path_keeps_everything_under_it(filled, tmp_path, monkeypatch):
    from robotrl.data.minari_io import export_minari, import_minari

    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    ds, episodes = filled
    import robotrl.tasks  # noqa: F401  (registers the robotrl/... gymnasium ids)

    exported = export_minari(ds, "demos-v1", env_id="robotrl/PandaReach-v0", data_path=tmp_path / "mroot")
    assert (tmp_path / "mroot" / "demos-v1" / "data" / "main_data.hdf5").is_file()
    assert exported.spec.env_spec.id == "robotrl/PandaReach-v0"
    assert "MINARI_DATASETS_PATH" not in os.environ
    back = import_minari("demos-v1", tmp_path / "back", data_path=tmp_path / "mroot")
    assert_episodes_equal(episodes[1], back.load(1))


def test_exporting_a_corrupt_dataset_writes_no_minari_dataset(filled, tmp_path):
    from robotrl.data.minari_io import export_minari

    ds, _ = filled
    path = ds.root / ds.entries[2].file
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DatasetError, match="checksum mismatch") as err:
        export_minari(ds, "demos-v2", data_path=tmp_path / "mroot")
    assert err.value.path == path and not (tmp_path / "mroot" / "demos-v2").exists()


def test_foreign_minari_dataset_is_flattened_and_its_actions_rescaled(tmp_path, monkeypatch):
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from robotrl.data.minari_io import import_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    rng = np.random.default_rng(0)
    low, high = np.array([0.0, -2.0]), np.array([4.0, 2.0])
    buffers = []
    for length in (4, 6):
        actions = rng.uniform(low, high, size=(length, 2))
        actions[0] = high
        buffers.append(
            EpisodeBuffer(
                observations=rng.normal(size=(length + 1, 2, 3)),  # float64, two dimensions
                actions=actions,
                rewards=rng.normal(size=length),
                terminations=np.arange(length) == length - 1,
                truncations=np.zeros(length, dtype=bool),
                infos={"is_success": np.arange(length + 1) == length},
            )
        )
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            "foreign-v0",
            buffers,
            observation_space=gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
            action_space=gym.spaces.Box(low, high, (2,), np.float64),
        )

    ds = import_minari("foreign-v0", tmp_path / "imported", metadata={"task": "reach"})
    assert ds.obs_spec == {"state": TensorSpec((6,))} and ds.action_dim == 2
    assert ds.metadata["source"] == "minari" and ds.metadata["task"] == "reach"
    assert "low=[0.0, -2.0] high=[4.0, 2.0]" in ds.metadata["action_rescaled"]
    for buffer, episode in zip(buffers, ds.load_all(), strict=True):
        np.testing.assert_allclose(episode.obs["state"].numpy(), buffer.observations.reshape(-1, 6), rtol=1e-6)
        expected = 2 * (buffer.actions - low) / (high - low) - 1
        np.testing.assert_allclose(episode.action.numpy(), expected, rtol=1e-6, atol=1e-6)
        assert episode.action[0].tolist() == [1.0, 1.0]
        assert episode.success.tolist() == [False] * (len(episode) - 1) + [True]
        assert episode.terminated[-1] and episode.metadata["minari_episode_id"] in {"0", "1"}

    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            "discrete-v0",
            [
                EpisodeBuffer(
                    observations=np.zeros((3, 2)),
                    actions=np.zeros(2, dtype=np.int64),
                    rewards=np.zeros(2),
                    terminations=np.zeros(2, dtype=bool),
                    truncations=np.zeros(2, dtype=bool),
                )
            ],
            observation_space=gym.spaces.Box(-1, 1, (2,)),
            action_space=gym.spaces.Discrete(3),
        )
    with pytest.raises(ValueError, match=r"'discrete-v0': action space Discrete\(3\) is not supported"):
        import_minari("discrete-v0", tmp_path / "discrete")
    assert not (tmp_path / "discrete").exists()


def test_foreign_actions_outside_their_bounds_are_rejected_before_anything_is_written(tmp_path, monkeypatch):
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from robotrl.data.minari_io import import_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    good = EpisodeBuffer(
        observations=np.zeros((3, 2)),
        actions=np.zeros((2, 1)),
        rewards=np.zeros(2),
        terminations=np.zeros(2, dtype=bool),
        truncations=np.zeros(2, dtype=bool),
    )
    bad = EpisodeBuffer(
        observations=np.zeros((3, 2)),
        actions=np.array([[0.5], [3.0]]),
        rewards=np.zeros(2),
        terminations=np.zeros(2, dtype=bool),
        truncations=np.zeros(2, dtype=bool),
    )
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            "bounds-v0",
            [good, bad],
            observation_space=gym.spaces.Box(-1, 1, (2,)),
            action_space=gym.spaces.Box(-1, 1, (1,)),
        )
    with pytest.raises(ValueError, match=r"episode 1: action: outside \[-1, 1\] at step 1"):
        import_minari("bounds-v0", tmp_path / "imported")
    assert not (tmp_path / "imported").exists()


def test_missing_minari_names_the_extra_to_install(filled, monkeypatch):
    from robotrl.data.minari_io import export_minari

    monkeypatch.setitem(sys.modules, "minari", None)
    with pytest.raises(ImportError, match=r"pip install robotrl\[datasets\]"):
        export_minari(filled[0], "x-v0")
