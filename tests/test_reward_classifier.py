"""Reward classifier: learning, threshold calibration, save/load, episode frames, the env wrapper, the CLI."""

import json
import re

import pytest
import torch
from helpers import run_module, run_with_file_size_limit

from robotrl.core.env import StepResult
from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import Episode, EpisodeDataset
from robotrl.hil.classifier_reward import ClassifierReward
from robotrl.hil.reward_classifier import (
    ClassifierArchitecture,
    RewardClassifier,
    TrainSettings,
    binary_metrics,
    calibrate_threshold,
    frames_from_episodes,
    split_episodes,
    train_classifier,
)

SIZE = 32
TINY = {"channels": 8, "layers": 3, "stride": 2, "feature_dim": 16, "hidden": (32,)}


def tiny_classifier(cameras=("front",), image_size=SIZE, frame_stack=1, threshold=0.5) -> RewardClassifier:
    return RewardClassifier(ClassifierArchitecture(cameras, image_size, frame_stack, **TINY), threshold)


def synthetic_frames(labels: torch.Tensor, generator: torch.Generator, size: int = SIZE) -> torch.Tensor:
    """Dim noise with a bright 6x6 square: top-left quadrant for success, bottom-right for failure."""
    frames = torch.randint(0, 60, (len(labels), 3, size, size), dtype=torch.uint8, generator=generator)
    corners = torch.randint(2, size // 2 - 6, (len(labels), 2), generator=generator)
    for i, (row, col) in enumerate(corners.tolist()):
        if not labels[i]:
            row, col = row + size // 2, col + size // 2
        frames[i, :, row : row + 6, col : col + 6] = 255
    return frames


def synthetic_set(count: int, seed: int) -> tuple[dict, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.rand(count, generator=generator) < 0.2  # success frames are the rare class
    return {"pixels_front": synthetic_frames(labels, generator)}, labels


def test_classifier_learns_synthetic_success_frames():
    train_frames, train_labels = synthetic_set(600, seed=1)
    test_frames, test_labels = synthetic_set(300, seed=2)
    model = tiny_classifier()
    fit = train_classifier(
        model, train_frames, train_labels, TrainSettings(epochs=6, batch_size=64, lr=3e-3, shift_pad=2)
    )
    assert fit["pos_weight"] == pytest.approx((~train_labels).sum().item() / train_labels.sum().item())
    calibration = calibrate_threshold(model.probabilities(test_frames), test_labels, min_precision=0.95)
    model.threshold = calibration.threshold
    metrics = binary_metrics(model.predict(test_frames), test_labels)
    assert metrics["accuracy"] >= 0.95, metrics
    assert calibration.met_min_precision


def test_calibration_picks_the_highest_recall_at_the_precision_target():
    probs = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.4, 0.3])
    labels = torch.tensor([1, 1, 0, 1, 0, 0])
    strict = calibrate_threshold(probs, labels, min_precision=0.95)
    # only the two top frames keep precision 1; the threshold sits between 0.8 and the next value
    assert strict.threshold == pytest.approx(0.75)
    assert (strict.precision, strict.recall, strict.accuracy) == (1.0, pytest.approx(2 / 3), pytest.approx(5 / 6))
    assert strict.met_min_precision and strict.note == ""
    loose = calibrate_threshold(probs, labels, min_precision=0.7)
    assert loose.threshold == pytest.approx(0.5)
    assert (loose.precision, loose.recall) == (0.75, 1.0)
    assert loose.counts == {"tp": 3, "fp": 1, "tn": 2, "fn": 0}


def test_calibration_falls_back_to_best_f1_and_says_so(caplog):
    probs = torch.tensor([0.9, 0.8, 0.6, 0.2])
    labels = torch.tensor([False, True, True, False])  # the most confident frame is a failure
    result = calibrate_threshold(probs, labels, min_precision=0.99)
    assert not result.met_min_precision
    assert "no threshold reaches precision 0.99" in result.note and "best F1" in result.note
    assert "no threshold reaches precision" in caplog.text
    assert result.threshold == pytest.approx(0.4)  # accepts 0.9, 0.8, 0.6: F1 0.8, the best
    assert result.recall == 1.0 and result.precision == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("probs", "labels", "min_precision", "message"),
    [
        (torch.tensor([0.5, 1.5]), torch.tensor([1, 0]), 0.95, "probabilities in"),
        (torch.tensor([0.5, 0.2]), torch.tensor([0, 0]), 0.95, "success frames"),
        (torch.tensor([0.5, 0.2]), torch.tensor([1, 2]), 0.95, "0/1 or bool"),
        (torch.tensor([0.5, 0.2]), torch.tensor([1]), 0.95, r"shape \[2\]"),
        (torch.tensor([0.5, 0.2]), torch.tensor([1, 0]), 1.5, "min_precision"),
        (torch.zeros(0), torch.zeros(0), 0.95, "non-empty"),
    ],
)
def test_calibration_rejects_bad_input(probs, labels, min_precision, message):
    with pytest.raises(ValueError, match=message):
        calibrate_threshold(probs, labels, min_precision)


def test_save_load_round_trip_gives_equal_outputs(tmp_path):
    model = tiny_classifier(cameras=("front", "wrist"), frame_stack=2, threshold=0.37)
    frames = {
        key: torch.randint(0, 256, (5, 6, SIZE, SIZE), dtype=torch.uint8) for key in ("pixels_front", "pixels_wrist")
    }
    model.save(tmp_path / "clf", extra={"calibration": {"note": "hand-made"}})
    loaded = RewardClassifier.load(tmp_path / "clf")
    assert torch.equal(loaded.probabilities(frames), model.probabilities(frames))
    assert loaded.threshold == 0.37 and loaded.architecture == model.architecture
    config = json.loads((tmp_path / "clf" / "config.json").read_text())
    assert config["cameras"] == ["front", "wrist"] and config["image_size"] == SIZE and config["frame_stack"] == 2
    assert config["calibration"] == {"note": "hand-made"}
    assert sorted(p.name for p in (tmp_path / "clf").iterdir()) == ["config.json", "model.safetensors"]


def test_load_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        RewardClassifier.load(tmp_path)
    tiny_classifier().save(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a reward classifier"):
        RewardClassifier.load(tmp_path)


SAVE_AGAIN = f"""
import sys
from robotrl.hil.reward_classifier import ClassifierArchitecture, RewardClassifier
model = RewardClassifier(ClassifierArchitecture(("front",), {SIZE}, 1, **{TINY!r}), 0.9)
model.save(sys.argv[1], extra={{"note": "x" * 50_000}})  # a config larger than the weights
"""


def test_a_save_cut_short_leaves_no_torn_file(tmp_path):
    """A disk that fills up while a classifier is saved over an older one (retraining into the same `out`): each
    file is the old one or the new one, and a mix of the two is refused by the config's checksum, by name."""
    tiny_classifier(threshold=0.3).save(tmp_path / "clf")
    config = (tmp_path / "clf" / "config.json").read_bytes()
    size = (tmp_path / "clf" / "model.safetensors").stat().st_size
    proc = run_with_file_size_limit(2 * size, SAVE_AGAIN, str(tmp_path / "clf"))  # the weights fit, the config not
    assert proc.returncode != 0 and "File too large" in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "clf" / "config.json").read_bytes() == config
    with pytest.raises(ValueError, match=r"model\.safetensors: checksum mismatch"):
        RewardClassifier.load(tmp_path / "clf")
    assert sorted(p.name for p in (tmp_path / "clf").iterdir()) == ["config.json", "model.safetensors"]


def test_weights_that_are_not_the_configs_or_not_safetensors_are_refused_naming_the_file(tmp_path):
    tiny_classifier(threshold=0.3).save(tmp_path / "old")
    tiny_classifier(threshold=0.9).save(tmp_path / "new")
    weights = tmp_path / "old" / "model.safetensors"
    weights.write_bytes((tmp_path / "new" / "model.safetensors").read_bytes())  # a save stopped between its files
    with pytest.raises(ValueError, match=rf"{re.escape(str(weights))}: checksum mismatch .*config\.json says"):
        RewardClassifier.load(tmp_path / "old")
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    del config["weights_sha256"]  # saved before configs recorded it
    (tmp_path / "new" / "config.json").write_text(json.dumps(config))
    (tmp_path / "new" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / 'new' / 'model.safetensors'))} is not a"):
        RewardClassifier.load(tmp_path / "new")
    (tmp_path / "new" / "config.json").write_text("{truncated")
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / 'new' / 'config.json'))} is not valid JSON"):
        RewardClassifier.load(tmp_path / "new")


def test_bad_frames_fail_naming_the_camera_entry():
    model = tiny_classifier(cameras=("front", "wrist"))
    good = torch.zeros(2, 3, SIZE, SIZE, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"'pixels_wrist'.*uint8"):
        model.probabilities({"pixels_front": good, "pixels_wrist": good.float()})
    with pytest.raises(ValueError, match=r"'pixels_front'.*expected shape \[batch, 3, 32, 32\], got \[2, 3, 16, 16\]"):
        model.probabilities({"pixels_front": good[..., :16, :16], "pixels_wrist": good})
    with pytest.raises(KeyError, match="missing camera entry 'pixels_wrist'"):
        model.predict({"pixels_front": good})
    with pytest.raises(ValueError, match=r"'pixels_wrist'\]: batch of 1"):
        model.predict({"pixels_front": good, "pixels_wrist": good[:1]})
    with pytest.raises(ValueError, match="training labels"):
        train_classifier(model, {"pixels_front": good, "pixels_wrist": good}, torch.tensor([True, True]))
    with pytest.raises(ValueError, match="threshold"):
        tiny_classifier(threshold=1.2)
    with pytest.raises(ValueError, match="frame_stack must be >= 1"):
        tiny_classifier(frame_stack=0)
    with pytest.raises(ValueError, match="epochs"):
        TrainSettings(epochs=0).validate()


def make_episode(steps: int, success_from: int | None, size: int = SIZE, seed: int = 0) -> Episode:
    """A recorded episode whose frames show a success square from step `success_from` on (None: never)."""
    generator = torch.Generator().manual_seed(seed)
    success = torch.zeros(steps, dtype=torch.bool)
    if success_from is not None:
        success[success_from:] = True
    frame_labels = torch.cat([torch.zeros(1, dtype=torch.bool), success])  # obs[t+1] carries success[t]
    return Episode(
        obs={"pixels_front": synthetic_frames(frame_labels, generator, size), "ee_pos": torch.zeros(steps + 1, 3)},
        action=torch.zeros(steps, 4),
        reward=torch.zeros(steps),
        terminated=torch.zeros(steps, dtype=torch.bool),
        truncated=torch.arange(steps) == steps - 1,
        success=success,
        intervention=torch.zeros(steps, dtype=torch.bool),
    )


def test_frames_from_episodes_labels_next_observations_and_stacks_within_episodes():
    first, second = make_episode(4, success_from=2), make_episode(3, success_from=None, seed=1)
    frames, labels = frames_from_episodes([first, second], ["front"])
    assert labels.tolist() == [False, False, False, True, True] + [False] * 4
    assert torch.equal(frames["pixels_front"][:5], first.obs["pixels_front"])
    stacked, _ = frames_from_episodes([first, second], ["front"], frame_stack=2)
    assert stacked["pixels_front"].shape == (9, 6, SIZE, SIZE)
    images = second.obs["pixels_front"]
    # the second episode's first stack repeats its own first frame, never the first episode's last one
    assert torch.equal(stacked["pixels_front"][5], torch.cat([images[0], images[0]]))
    assert torch.equal(stacked["pixels_front"][7], torch.cat([images[1], images[2]]))
    with pytest.raises(KeyError, match="episode 0: no camera entry 'pixels_wrist'"):
        frames_from_episodes([first, second], ["wrist"])


def test_split_is_by_whole_episodes():
    episodes = [make_episode(2, None, seed=i) for i in range(10)]
    train, held_out, test = split_episodes(episodes, held_out_fraction=0.3, seed=3)
    assert (len(train), len(held_out), test) == (7, 3, [])
    train, held_out, test = split_episodes(episodes, held_out_fraction=0.2, test_fraction=0.2, seed=3)
    assert (len(train), len(held_out), len(test)) == (6, 2, 2)
    ids = [{id(e) for e in part} for part in (train, held_out, test)]
    assert len(ids[0] | ids[1] | ids[2]) == 10
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_episodes(episodes, 1.0)
    with pytest.raises(ValueError, match="test_fraction"):
        split_episodes(episodes, 0.5, test_fraction=0.5)


def test_split_gives_every_part_successful_episodes_when_they_are_rare():
    """3 successes in 10 episodes: with a plain shuffle, 29 of seeds 0-49 left held-out with none (and the
    calibration failed after training)."""
    episodes = [make_episode(2, 1 if i < 3 else None, seed=i) for i in range(10)]
    for seed in range(50):
        train, held_out, test = split_episodes(episodes, held_out_fraction=0.2, test_fraction=0.1, seed=seed)
        assert (len(train), len(held_out), len(test)) == (7, 2, 1)
        for part in (train, held_out, test):
            assert sum(e.success_any for e in part) == 1, seed
    proportional = [make_episode(2, 1 if i % 2 else None, seed=i) for i in range(20)]
    train, held_out, _ = split_episodes(proportional, held_out_fraction=0.2, seed=0)
    assert (sum(e.success_any for e in train), sum(e.success_any for e in held_out)) == (8, 2)


def test_metrics_of_a_split_without_positives_are_undefined_not_zero():
    metrics = binary_metrics(torch.zeros(5, dtype=torch.bool), torch.zeros(5, dtype=torch.bool))
    assert metrics["precision"] is None and metrics["recall"] is None and metrics["accuracy"] == 1.0


def test_train_classifier_refuses_too_few_successes_and_a_dataset_named_twice(tmp_path):
    from robotrl.train_classifier import TrainClassifierConfig, run

    write_dataset(tmp_path / "one", [make_episode(6, 3 if i == 0 else None, seed=i) for i in range(5)])
    cfg = TrainClassifierConfig(datasets=[str(tmp_path / "one")], out=str(tmp_path / "clf"))
    with pytest.raises(ValueError, match="1 of 5 episodes reach success; the classifier needs at least 2"):
        run(cfg)
    cfg.datasets = [str(tmp_path / "one"), str(tmp_path / "one") + "/"]
    with pytest.raises(ValueError, match=r"is '.*one' again; name each dataset once"):
        run(cfg)
    assert not (tmp_path / "clf").exists()


class CountingPixelEnv:
    """A VecEnv whose frames show the step count (older stacked frames are black); episodes last
    `episode_steps`."""

    name, action_dim, has_success = "counting", 1, True

    def __init__(self, num_envs: int = 1, size: int = SIZE, episode_steps: int = 5, stack: int = 1):
        self.num_envs, self.size, self.episode_steps, self.stack = num_envs, size, episode_steps, stack
        self.obs_spec = {"pixels_front": TensorSpec((3 * stack, size, size), torch.uint8), "x": TensorSpec((1,))}
        self.resets, self.t = 0, 0

    def _obs(self):
        pixels = torch.zeros(self.num_envs, 3 * self.stack, self.size, self.size, dtype=torch.uint8)
        pixels[:, -3:] = 40 * self.t
        return {"pixels_front": pixels, "x": torch.full((self.num_envs, 1), float(self.t))}

    def reset(self, seed=None):
        self.resets, self.t = self.resets + 1, 0
        return self._obs()

    def step(self, action):
        self.t += 1
        next_obs = self._obs()
        truncated = torch.full((self.num_envs,), self.t >= self.episode_steps)
        obs = self.reset() if bool(truncated.any()) else next_obs
        zeros = torch.zeros(self.num_envs, dtype=torch.bool)
        return StepResult(obs, next_obs, torch.full((self.num_envs,), -1.0), zeros, truncated, zeros)

    def render(self):
        raise NotImplementedError

    def close(self):
        pass


def constant_classifier(probability_logit: float) -> RewardClassifier:
    model = tiny_classifier()
    with torch.no_grad():
        model.head.head.weight.zero_()
        model.head.head.bias.fill_(probability_logit)
    return model


def test_wrapper_terminates_on_success_with_one_env():
    env = CountingPixelEnv()
    wrapped = ClassifierReward(env, constant_classifier(5.0), success_reward=2.0, terminate_on_success=True)
    wrapped.reset(seed=0)
    result = wrapped.step(torch.zeros(1, 1))
    assert result.reward.tolist() == [2.0] and result.success.tolist() == [True]
    assert result.terminated.tolist() == [True] and result.truncated.tolist() == [False]
    assert result.next_obs["x"].item() == 1.0 and result.obs["x"].item() == 0.0  # a fresh episode's first obs
    assert env.resets == 2 and wrapped.env_success.tolist() == [False]


def test_wrapper_leaves_an_episode_the_env_ended_itself_alone():
    env = CountingPixelEnv(episode_steps=1)
    wrapped = ClassifierReward(env, constant_classifier(5.0), terminate_on_success=True)
    wrapped.reset()
    result = wrapped.step(torch.zeros(1, 1))
    assert result.terminated.tolist() == [True] and result.truncated.tolist() == [False]
    assert env.resets == 2  # the env's own reset only; a second one would skip an episode


def test_wrapper_reads_the_newest_frame_of_a_stack():
    env = CountingPixelEnv(num_envs=3, stack=2)
    classifier = tiny_classifier()
    wrapped = ClassifierReward(env, classifier)
    wrapped.reset()
    next_obs = wrapped.step(torch.zeros(3, 1)).next_obs
    newest = classifier.probabilities({"pixels_front": next_obs["pixels_front"][:, 3:]})
    oldest = classifier.probabilities({"pixels_front": next_obs["pixels_front"][:, :3]})
    assert not torch.allclose(newest, oldest)
    classifier.threshold = float(newest[0] + oldest[0]) / 2  # between the two: the frame read decides
    assert torch.equal(wrapped.classify(next_obs), newest >= classifier.threshold)
    assert torch.equal(wrapped.classify(next_obs), oldest < classifier.threshold)


def test_wrapper_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="terminate_on_success needs num_envs == 1, got 2"):
        ClassifierReward(CountingPixelEnv(num_envs=2), tiny_classifier(), terminate_on_success=True)
    with pytest.raises(ValueError, match=r"'pixels_front' is \[3, 16, 16\].*needs uint8 \[3"):
        ClassifierReward(CountingPixelEnv(size=16), tiny_classifier())
    with pytest.raises(ValueError, match="reads 'pixels_wrist'"):
        ClassifierReward(CountingPixelEnv(), tiny_classifier(cameras=("wrist",)))
    with pytest.raises(ValueError, match="failure_reward"):
        ClassifierReward(CountingPixelEnv(), tiny_classifier(), failure_reward=float("nan"))


def test_wrapper_on_panda_pick_cube_pixels():
    from robotrl.tasks import TASK_CONFIGS, make_env

    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", obs="pixels", image_size=64, episode_steps=3)
    classifier = RewardClassifier(ClassifierArchitecture(("front",), 64, **TINY))
    env = ClassifierReward(make_env(cfg, num_envs=2), classifier, success_reward=1.0, failure_reward=-0.5)
    assert env.obs_spec["pixels_front"].shape == (3, 64, 64) and env.num_envs == 2 and env.has_success
    env.reset(seed=0)
    for step in range(3):
        action = env.env.task.expert_action()
        result = env.step(action)
        probs = classifier.probabilities(result.next_obs)
        expected = probs >= classifier.threshold
        assert torch.equal(result.success, expected)
        assert torch.equal(result.reward, torch.where(expected, 1.0, -0.5))
        assert result.reward.dtype == torch.float32 and env.env_success.shape == (2,)
        assert result.truncated.tolist() == [step == 2] * 2
    env.close()


def write_dataset(root, episodes):
    spec = {key: TensorSpec(tuple(value.shape[1:]), value.dtype) for key, value in episodes[0].obs.items()}
    dataset = EpisodeDataset.create(root, spec, action_dim=4)
    for episode in episodes:
        dataset.append(episode)


def test_train_classifier_entry_point(tmp_path):
    from robotrl.train_classifier import TrainClassifierConfig, run

    episodes = [make_episode(30, success_from=12 if i % 2 else None, seed=i) for i in range(12)]
    write_dataset(tmp_path / "a", episodes[:6])
    write_dataset(tmp_path / "b", episodes[6:])
    cfg = TrainClassifierConfig(
        datasets=[str(tmp_path / "a"), str(tmp_path / "b")],
        out=str(tmp_path / "clf"),
        epochs=8,
        lr=3e-3,
        shift_pad=2,
        batch_size=64,
        held_out_fraction=0.25,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in TINY.items()},
    )
    report = run(cfg)
    saved = json.loads((tmp_path / "clf" / "report.json").read_text())
    assert saved["threshold"] == report["threshold"] and saved["evaluated_on"] == "held_out"
    assert saved["counts"]["episodes_train"] == 9 and saved["counts"]["episodes_held_out"] == 3
    assert saved["counts"]["frames_held_out"] == 3 * 31
    assert report["accuracy"] >= 0.9, report
    loaded = RewardClassifier.load(tmp_path / "clf")
    assert loaded.threshold == report["threshold"]
    assert json.loads((tmp_path / "clf" / "config.json").read_text())["calibration"]["threshold"] == report["threshold"]


def test_train_classifier_cli_rejects_unknown_keys(tmp_path):
    proc = run_module("robotrl.train_classifier", "datasets=[x]", f"out={tmp_path}", "epoch=3", check=False)
    assert proc.returncode != 0
    assert "Key 'epoch' not in 'TrainClassifierConfig'" in proc.stderr


def test_hil_config_puts_a_saved_classifier_in_front_of_the_operator(tmp_path):
    from robotrl.tasks import TASK_CONFIGS, make_env

    from robotrl.hil.config import HILConfig
    from robotrl.hil.intervention import InterventionEnv
    from robotrl.hil.setup import wrap_for_hil

    classifier = RewardClassifier(ClassifierArchitecture(("front",), 64, **TINY))
    with torch.no_grad():
        classifier.head.head.weight.zero_()
        classifier.head.head.bias.fill_(5.0)  # always success
    classifier.save(tmp_path / "classifier")
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", obs="pixels", image_size=64, episode_steps=3)
    hil = HILConfig(operator="scripted", reward_classifier=str(tmp_path / "classifier"))
    env = wrap_for_hil(make_env(cfg, num_envs=1), hil)
    assert isinstance(env, InterventionEnv) and isinstance(env.env, ClassifierReward)
    env.reset(seed=0)
    result = env.step(torch.zeros(1, env.action_dim))
    assert result.reward.tolist() == [1.0] and result.success.tolist() == [True]  # the classifier's verdict

    with pytest.raises(FileNotFoundError, match="missing_dir"):
        wrap_for_hil(make_env(cfg, num_envs=1), HILConfig(reward_classifier=str(tmp_path / "missing_dir")))


def saved_constant_classifier(path, verdict: bool, image_size=SIZE):
    classifier = RewardClassifier(ClassifierArchitecture(("front",), image_size, **TINY))
    with torch.no_grad():
        classifier.head.head.weight.zero_()
        classifier.head.head.bias.fill_(5.0 if verdict else -5.0)
    classifier.save(path)
    return str(path)


@pytest.mark.parametrize("verdict", [True, False])
def test_demonstrations_are_rewarded_by_the_runs_classifier(tmp_path, verdict):
    """Online steps get the classifier's 1/0; demos recorded with the sparse -1/0 would put a demo's success
    level with an online failure."""
    from robotrl.data.replay import ReplayBuffer
    from robotrl.hil.setup import load_demos

    episodes = [make_episode(6, success_from=3, seed=i) for i in range(2)]
    for episode in episodes:
        episode.reward = episode.success.float() - 1.0
    write_dataset(tmp_path / "demos", episodes)
    spec = {"pixels_front": TensorSpec((3, SIZE, SIZE), torch.uint8), "ee_pos": TensorSpec((3,))}
    recorded, relabelled = ReplayBuffer(spec, 4, 64), ReplayBuffer(spec, 4, 64)
    load_demos([str(tmp_path / "demos")], recorded, spec, 4)
    classifier = saved_constant_classifier(tmp_path / "clf", verdict)
    assert load_demos([str(tmp_path / "demos")], relabelled, spec, 4, reward_classifier=classifier) == 12
    assert sorted(set(recorded.sample(64).reward.flatten().tolist())) == [-1.0, 0.0]
    assert set(relabelled.sample(64).reward.flatten().tolist()) == {1.0 if verdict else 0.0}


def test_with_termination_at_success_demonstrations_end_at_the_classifiers_first_verdict(tmp_path):
    """The classifier, not the recording, owns success: a demo it judges successful from the first frame is
    one terminal step long; one it never judges successful is kept whole, whatever the recording said."""
    from robotrl.data.replay import ReplayBuffer
    from robotrl.hil.setup import load_demos

    write_dataset(tmp_path / "demos", [make_episode(6, success_from=3, seed=i) for i in range(2)])
    spec = {"pixels_front": TensorSpec((3, SIZE, SIZE), torch.uint8), "ee_pos": TensorSpec((3,))}
    demos = [str(tmp_path / "demos")]
    assert load_demos(demos, ReplayBuffer(spec, 4, 64), spec, 4, terminate_on_success=True) == 8
    always, never = saved_constant_classifier(tmp_path / "yes", True), saved_constant_classifier(tmp_path / "no", False)
    offline = ReplayBuffer(spec, 4, 64)
    assert load_demos(demos, offline, spec, 4, reward_classifier=always, terminate_on_success=True) == 2
    assert offline.terminated[:2, 0].all() and offline.reward[:2, 0].tolist() == [1.0, 1.0]
    assert (
        load_demos(demos, ReplayBuffer(spec, 4, 64), spec, 4, reward_classifier=never, terminate_on_success=True) == 12
    )


def test_the_classifier_not_the_simulator_ends_episodes_on_success(tmp_path):
    from robotrl.tasks import TASK_CONFIGS, make_env

    from robotrl.hil.config import HILConfig
    from robotrl.hil.setup import env_task, wrap_for_hil

    cfg = TASK_CONFIGS["panda_reach"](
        name="panda_reach", obs="pixels", image_size=64, terminate_on_success=True, success_threshold=10.0
    )  # the simulator's check passes at every step
    for verdict in (False, True):
        hil = HILConfig(reward_classifier=saved_constant_classifier(tmp_path / f"clf_{verdict}", verdict, 64))
        task = env_task(cfg, hil)
        assert not task.terminate_on_success and cfg.terminate_on_success
        env = wrap_for_hil(make_env(task, num_envs=1), hil, terminate_on_success=cfg.terminate_on_success)
        env.reset(seed=0)
        result = env.step(torch.zeros(1, env.action_dim))
        assert env.env_success.tolist() == [True]
        assert result.terminated.tolist() == [verdict] and result.reward.tolist() == [float(verdict)]
        env.close()
