"""LeRobotDataset v3 export and import: exact round trips, the format's own schema, foreign datasets, refusals."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow", reason="the lerobot-format extra (pyarrow) is not installed")
av = pytest.importorskip("av", reason="the lerobot-format extra (PyAV) is not installed")
import pyarrow.parquet as pq  # noqa: E402

from robotrl.core.spec import TensorSpec  # noqa: E402
from robotrl.data.dataset import Episode, EpisodeDataset  # noqa: E402
from robotrl.data.lerobot_io import export_lerobot, import_lerobot, read_lerobot  # noqa: E402

SPEC = {
    "arm_qpos": TensorSpec((3,)),
    "ee_pos": TensorSpec((2,)),
    "pixels_front": TensorSpec((3, 16, 24), torch.uint8),
    "contacts": TensorSpec((2,), torch.int64),
}
STATE_SPEC = {"arm_qpos": TensorSpec((3,)), "ee_pos": TensorSpec((2,))}
ACTION_DIM = 2
FPS = 10
STEPS = ("action", "reward", "terminated", "truncated", "success", "intervention")


def make_episode(spec, length: int, seed: int, smooth: bool = False) -> Episode:
    g = torch.Generator().manual_seed(seed)
    obs = {}
    for key, s in spec.items():
        if s.dtype == torch.uint8 and smooth:  # gradients that move: what a camera sees, not noise
            y, x = torch.arange(s.shape[1]).view(-1, 1), torch.arange(s.shape[2]).view(1, -1)
            frames = [torch.stack([20 + 4 * y + 3 * x + 2 * t + 30 * c for c in range(3)]) for t in range(length + 1)]
            obs[key] = torch.stack(frames).to(torch.uint8)
        elif s.dtype == torch.float32:
            obs[key] = torch.randn(length + 1, *s.shape, generator=g)
        else:
            obs[key] = torch.randint(0, 255, (length + 1, *s.shape), generator=g).to(s.dtype)
    ended = torch.zeros(length, dtype=torch.bool)
    ended[-1] = True
    return Episode(
        obs=obs,
        action=torch.rand(length, ACTION_DIM, generator=g) * 2 - 1,
        reward=torch.randn(length, generator=g),
        terminated=ended if seed % 2 else torch.zeros_like(ended),
        truncated=torch.zeros_like(ended) if seed % 2 else ended,
        success=torch.rand(length, generator=g) > 0.5,
        intervention=torch.rand(length, generator=g) > 0.5,
        metadata={"seed": str(seed), "source": "teleop"},
    )


def make_dataset(root, spec=SPEC, lengths=(5, 7, 4), smooth=False) -> EpisodeDataset:
    dataset = EpisodeDataset.create(root, spec, ACTION_DIM, {"task": "panda_reach", "reward": "dense"})
    for seed, length in enumerate(lengths):
        dataset.append(make_episode(spec, length, seed, smooth))
    return dataset


def assert_same_episodes(left, right, exact_images: bool = True) -> None:
    for a, b in zip(left, right, strict=True):
        for key, value in a.obs.items():
            if exact_images or value.dtype != torch.uint8:
                assert torch.equal(value, b.obs[key]), key
        for name in STEPS:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.metadata == b.metadata


def check_lerobot_schema(root, dataset: EpisodeDataset) -> None:
    """What LeRobot's reader relies on, checked file by file against meta/info.json."""
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert info["total_episodes"] == len(dataset) and info["total_frames"] == dataset.num_steps
    assert info["splits"] == {"train": f"0:{len(dataset)}"}
    features = info["features"]
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index", "action", "next.reward"):
        assert name in features
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    columns = {n for n, f in features.items() if f["dtype"] != "video"}
    assert set(data.column_names) == columns
    for name in columns:
        feature, field = features[name], data.schema.field(name)
        if feature["shape"] == [1]:
            assert str(field.type) == {"float32": "float", "bool": "bool", "int64": "int64"}[feature["dtype"]], name
        else:  # datasets' Sequence(length=D): a fixed-size list of the feature's dtype
            assert pa.types.is_fixed_size_list(field.type) and field.type.list_size == feature["shape"][0], name
    assert data.column("index").to_pylist() == list(range(dataset.num_steps))
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in episodes] == [e.length for e in dataset.entries]
    frames = 0
    for number, row in enumerate(episodes):
        assert row["episode_index"] == number and row["tasks"] == ["panda_reach"]
        assert (row["dataset_from_index"], row["dataset_to_index"]) == (frames, frames + row["length"])
        frames += row["length"]
        for name in features:
            for stat in ("min", "max", "mean", "std", "count", "q01", "q50", "q99"):
                assert f"stats/{name}/{stat}" in row
    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats) == set(features)
    for name, feature in features.items():
        if feature["dtype"] != "video":
            assert np.array(stats[name]["mean"]).shape == tuple(feature["shape"]), name
    assert stats["index"]["count"] == [dataset.num_steps]
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("task").to_pylist() == ["panda_reach"] and tasks.schema.pandas_metadata["index_columns"] == [
        "task"
    ]
    for name, feature in features.items():
        if feature["dtype"] != "video":
            continue
        assert np.array(stats[name]["mean"]).shape == (3, 1, 1) and 0 <= min(stats[name]["min"][0][0]) <= 1
        last = episodes[-1]
        assert last[f"videos/{name}/to_timestamp"] == pytest.approx(dataset.num_steps / FPS)
        path = root / info["video_path"].format(video_key=name, chunk_index=0, file_index=0)
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert sum(1 for _ in container.decode(stream)) == dataset.num_steps
            assert (stream.height, stream.width, 3) == tuple(feature["shape"])
            assert (
                feature["info"]["video.fps"] == FPS
                and feature["info"]["video.codec"] == stream.codec_context.codec.canonical_name
            )


def test_state_and_pixel_datasets_round_trip_exactly_through_files_lerobot_reads(tmp_path):
    dataset = make_dataset(tmp_path / "robotrl")
    export_lerobot(dataset, tmp_path / "lerobot", fps=FPS)
    check_lerobot_schema(tmp_path / "lerobot", dataset)
    features = json.loads((tmp_path / "lerobot/meta/info.json").read_text())["features"]
    assert features["observation.state"]["names"] == ["arm_qpos.0", "arm_qpos.1", "arm_qpos.2", "ee_pos.0", "ee_pos.1"]
    assert features["observation.images.front"]["shape"] == [16, 24, 3]
    assert features["observation.contacts"] == {"dtype": "int64", "shape": [2], "names": None}
    back = import_lerobot(tmp_path / "lerobot", tmp_path / "back")
    assert back.obs_spec == dataset.obs_spec and back.metadata == dataset.metadata
    assert_same_episodes(dataset, back)

    state_only = make_dataset(tmp_path / "state", STATE_SPEC, lengths=(3, 6))
    export_lerobot(state_only, tmp_path / "lerobot_state", fps=FPS, task="panda_reach")
    check_lerobot_schema(tmp_path / "lerobot_state", state_only)
    assert not (tmp_path / "lerobot_state/videos").exists()
    assert_same_episodes(state_only, read_lerobot(f"lerobot:{tmp_path / 'lerobot_state'}"))


@pytest.mark.parametrize("video", ["h264", "av1"])
def test_lossy_video_settings_keep_camera_frames_within_codec_tolerance(tmp_path, video):
    dataset = make_dataset(tmp_path / "robotrl", {"pixels_front": TensorSpec((3, 16, 24), torch.uint8)}, (6, 5), True)
    scheduling = os.sched_getscheduler(0), os.sched_getparam(0)
    export_lerobot(dataset, tmp_path / "lerobot", fps=FPS, video=video)
    # SVT-AV1 moves its caller to SCHED_FIFO 99 where it may (as root): the export puts it back
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == scheduling
    check_lerobot_schema(tmp_path / "lerobot", dataset)
    back = read_lerobot(tmp_path / "lerobot")
    assert_same_episodes(dataset, back, exact_images=False)
    for a, b in zip(dataset, back, strict=True):
        error = (a.obs["pixels_front"].float() - b.obs["pixels_front"].float()).abs()
        assert error[-1].max() == 0  # the final observation is kept raw, beside the video
        assert error.mean() < 4.0 and error.max() < 64, (video, error.mean(), error.max())


def foreign_copy(tmp_path, dataset) -> object:
    """An export with robotrl's own files removed: what a LeRobot recording looks like to the import."""
    export_lerobot(dataset, tmp_path / "foreign", fps=FPS)
    for name in ("meta/robotrl.json", "meta/robotrl_final_observations.safetensors"):
        (tmp_path / "foreign" / name).unlink()
    return tmp_path / "foreign"


def test_a_foreign_dataset_fills_the_demo_buffer_through_hil_demos(tmp_path):
    from robotrl.data.replay import ReplayBuffer
    from robotrl.hil.setup import load_demos

    dataset = make_dataset(tmp_path / "robotrl", {**STATE_SPEC, "pixels_front": SPEC["pixels_front"]})
    root = foreign_copy(tmp_path, dataset)
    read = read_lerobot(root)
    assert read.metadata["source"] == "lerobot" and read.obs_spec == dataset.obs_spec
    for original, episode in zip(dataset, read, strict=True):
        assert torch.equal(episode.obs["arm_qpos"][:-1], original.obs["arm_qpos"][:-1])
        assert torch.equal(episode.obs["pixels_front"][-1], episode.obs["pixels_front"][-2])  # no final frame
        assert torch.equal(episode.action, original.action) and bool(episode.terminated[-1] | episode.truncated[-1])
    stacked = {**STATE_SPEC, "pixels_front": TensorSpec((6, 16, 24), torch.uint8)}  # the env stacks 2 frames
    offline = ReplayBuffer(stacked, ACTION_DIM, 100)
    assert load_demos([f"lerobot:{root}"], offline, stacked, ACTION_DIM, frame_stack=2) == dataset.num_steps
    assert len(offline) == dataset.num_steps


def test_features_the_task_does_not_have_are_refused_by_name(tmp_path):
    from robotrl.data.replay import ReplayBuffer
    from robotrl.hil.setup import load_demos

    root = foreign_copy(tmp_path, make_dataset(tmp_path / "robotrl"))
    wrist = {**SPEC, "pixels_wrist": SPEC["pixels_front"]}
    with pytest.raises(
        ValueError, match=r"no feature for the task's observation 'pixels_wrist'.*observation\.images\.wrist"
    ):
        read_lerobot(root, obs_spec=wrist, action_dim=ACTION_DIM)
    with pytest.raises(ValueError, match="feature 'action' has 2 entries, the task's action_dim is 7"):
        load_demos([f"lerobot:{root}"], ReplayBuffer(SPEC, 7, 10), SPEC, 7)
    bigger = r"feature 'observation\.images\.front' gives .* \[3, 16, 24\] uint8, the task needs \[3, 84, 84\]"
    with pytest.raises(ValueError, match=bigger):
        read_lerobot(root, obs_spec={**SPEC, "pixels_front": TensorSpec((3, 84, 84), torch.uint8)})
    no_contacts = {k: v for k, v in SPEC.items() if k != "contacts"}
    with pytest.raises(
        ValueError, match=r"feature 'observation\.contacts' \('contacts'\) is not an observation of the task"
    ):
        read_lerobot(root, obs_spec=no_contacts, action_dim=ACTION_DIM)
    read = read_lerobot(root, obs_spec=no_contacts, action_dim=ACTION_DIM, ignore_features=["observation.contacts"])
    assert set(read.obs_spec) == set(no_contacts)


def test_actions_outside_the_unit_box_need_bounds_and_bad_input_is_refused(tmp_path):
    root = foreign_copy(tmp_path, make_dataset(tmp_path / "robotrl", STATE_SPEC))
    data_path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data_path)
    raw = np.asarray(table.column("action").combine_chunks().flatten()).reshape(-1, ACTION_DIM) * 90.0  # degrees
    column = pa.FixedSizeListArray.from_arrays(pa.array(raw.reshape(-1).astype(np.float32)), ACTION_DIM)
    pq.write_table(table.set_column(table.column_names.index("action"), "action", column), data_path)
    with pytest.raises(ValueError, match=r"episode 0: feature 'action': frame \d+ is outside \[-1, 1\].*action_low"):
        read_lerobot(root)
    read = read_lerobot(root, action_low=[-90, -90], action_high=[90, 90])
    assert "action_rescaled" in read.metadata and float(read.episodes[0].action.abs().max()) <= 1.0

    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_lerobot(make_dataset(tmp_path / "again", STATE_SPEC), root, fps=FPS)
    with pytest.raises(ValueError, match="fps: expected an int >= 1"):
        export_lerobot(EpisodeDataset.open(tmp_path / "robotrl"), tmp_path / "new", fps=0)
    with pytest.raises(ValueError, match="video: expected one of"):
        export_lerobot(EpisodeDataset.open(tmp_path / "robotrl"), tmp_path / "new", fps=FPS, video="gif")
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps(info | {"codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match=r"codebase_version 'v2\.1' is not supported"):
        read_lerobot(root)
    with pytest.raises(FileNotFoundError, match="not a LeRobot dataset"):
        read_lerobot(tmp_path / "robotrl")


def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
    import robotrl.data.lerobot_io as lerobot_io

    dataset = make_dataset(tmp_path / "robotrl")
    monkeypatch.setattr(lerobot_io, "video_info", lambda path: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        export_lerobot(dataset, tmp_path / "lerobot", fps=FPS)
    assert not (tmp_path / "lerobot").exists()


def test_lerobot_itself_loads_the_export(tmp_path):
    lerobot_dataset = pytest.importorskip(
        "lerobot.datasets.lerobot_dataset",
        reason="the lerobot package is not installed (it pins torch below the 2.13 robotrl is tested with)",
    )
    dataset = make_dataset(tmp_path / "robotrl")
    export_lerobot(dataset, tmp_path / "lerobot", fps=FPS)
    loaded = lerobot_dataset.LeRobotDataset("local/robotrl_export", root=tmp_path / "lerobot")
    assert loaded.num_episodes == len(dataset) and loaded.num_frames == dataset.num_steps
    first, episode = loaded[0], dataset.load(0)
    assert torch.allclose(first["observation.state"], torch.cat([episode.obs["arm_qpos"][0], episode.obs["ee_pos"][0]]))
    image = (first["observation.images.front"] * 255).round().to(torch.uint8)
    assert torch.equal(image, episode.obs["pixels_front"][0])
    shutil.rmtree(tmp_path / "lerobot")
