"""Learned reward classifier on panda_pick_cube frames, labelled by the simulator's own success check.

Episodes are generated with pixel observations (64x64, the front and wrist cameras) and the scripted
expert, varied per episode so that failures look like successes from afar:
- `expert`: the expert with small action noise (mostly successes: the cube is held above 10 cm);
- `noisy`: the expert with large action noise (missed grasps, slips);
- `low_lift`: the expert, but the lift stops at a random height below the success height (held, not
  high enough: the nearest miss there is);
- `drop`: the expert, then the gripper opens at a random step of the lift or the hold (lifted, dropped);
- `random`: drifting random actions.
Episodes are split by episode (not frame) into train, calibration and test sets; the classifier trains
on the first, `calibrate_threshold` picks its threshold on the second (precision >= 0.95), and the
figures are measured on the test episodes, which neither saw. The training is the one
`robotrl-train-classifier` runs (`robotrl.train_classifier.train_and_calibrate`). Then the trained
classifier rewards fresh episodes live through `ClassifierReward`, compared with the simulator's success.

Figures: `accuracy`, `precision`, `recall` (test frames, at the calibrated threshold), `frames` (all
generated frames), `train_s` (training time), `generate_s`, `test_accuracy_by_mode`, `online` (the
wrapper's success against the simulator's, step by step). Goal: accuracy >= 0.95.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args

MODES = ("expert", "noisy", "low_lift", "drop", "random")
MODE_WEIGHTS = (0.3, 0.15, 0.2, 0.25, 0.1)
SUCCESS_HEIGHT = 0.10  # panda_pick_cube's LIFT_HEIGHT: the cube's bottom this far above the table
NUM_ENVS = 8


def pick_config(cameras: list[str]):
    from robotrl.tasks import TASK_CONFIGS

    return TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", obs="pixels", image_size=64, cameras=cameras)


class MixedPolicy:
    """Per-episode behaviour modes (MODES) over panda_pick_cube's scripted expert, for all envs of a task.
    Every pick episode lasts the task's 100 steps, so all envs start their episodes together."""

    def __init__(self, task, generator):
        self.task, self.generator = task, generator

    def start_episodes(self) -> None:
        import torch

        n, g = self.task.num_envs, self.generator
        self.modes = torch.multinomial(torch.tensor(MODE_WEIGHTS), n, True, generator=g)
        # low_lift: the cube's bottom held 3 to 9.5 cm up; drop: the gripper opens 0-35 steps into the lift
        self.hold_height = 0.03 + torch.rand(n, generator=g) * (SUCCESS_HEIGHT - 0.005 - 0.03)
        self.drop_after = torch.randint(0, 36, (n,), generator=g)
        self.noise_std = torch.where(self.modes == MODES.index("noisy"), 0.6, 0.1).unsqueeze(1)
        self.random_action = torch.rand(n, self.task.action_dim, generator=g) * 2 - 1
        self.lift_steps = torch.zeros(n, dtype=torch.long)

    def act(self):
        import torch
        from robotrl.tasks.panda_pick_cube import CUBE_HALF

        task, g, modes = self.task, self.generator, self.modes
        action = task.expert_action()  # called every step: it advances the expert's phases
        lifting = task.expert.phase == 3
        self.lift_steps += lifting.long()
        low = (modes == MODES.index("low_lift")) & lifting
        cube_z = task.backend.body_pose("cube")[0][:, 2]
        action[low, 2] = ((self.hold_height + CUBE_HALF - cube_z) / task.cfg.max_ee_step)[low]
        action[(modes == MODES.index("drop")) & (self.lift_steps > self.drop_after), 3] = -1.0
        action[:, :3] += torch.randn(task.num_envs, 3, generator=g) * self.noise_std
        # random: a drifting random action (a random walk covers more of the workspace than white noise)
        self.random_action += 0.3 * torch.randn(task.num_envs, task.action_dim, generator=g)
        self.random_action.clamp_(-1.0, 1.0)
        wander = modes == MODES.index("random")
        action[wander] = self.random_action[wander]
        return action.clamp_(-1.0, 1.0)


def generate_episodes(num_episodes: int, cameras: list[str], seed: int = 0) -> list:
    """`num_episodes` recorded pick episodes (robotrl.data.dataset.Episode, pixels only, metadata["mode"])."""
    import torch
    from robotrl.tasks import make_env

    from robotrl.data.dataset import EpisodeRecorder

    env = make_env(pick_config(cameras), num_envs=NUM_ENVS)
    policy = MixedPolicy(env.task, torch.Generator().manual_seed(seed))
    recorder = EpisodeRecorder(NUM_ENVS, {"task": "panda_pick_cube", "source": "bench/reward_classifier.py"})
    episodes = []
    recorder.start(env.reset(seed=seed))
    while len(episodes) < num_episodes:
        policy.start_episodes()
        finished = []
        for _ in range(env.task.episode_steps):
            action = policy.act()
            finished += recorder.step(action, env.step(action))
        if len(finished) != NUM_ENVS:
            raise RuntimeError(f"expected all {NUM_ENVS} pick episodes to end together, {len(finished)} did")
        for episode, mode in zip(finished, policy.modes.tolist(), strict=True):
            episode.metadata["mode"] = MODES[mode]
        episodes += finished
    env.close()
    return episodes[:num_episodes]


def online_check(classifier, cameras: list[str], rounds: int, seed: int) -> dict:
    """The classifier as the reward of live episodes (ClassifierReward): its success against the simulator's."""
    import torch
    from robotrl.tasks import make_env

    from robotrl.hil.classifier_reward import ClassifierReward
    from robotrl.hil.reward_classifier import binary_metrics

    env = ClassifierReward(make_env(pick_config(cameras), num_envs=NUM_ENVS), classifier)
    policy = MixedPolicy(env.env.task, torch.Generator().manual_seed(seed))
    env.reset(seed=seed)
    predicted, actual = [], []
    start = time.perf_counter()
    for _ in range(rounds):
        policy.start_episodes()
        for _ in range(env.env.task.episode_steps):
            result = env.step(policy.act())
            predicted.append(result.success)
            actual.append(env.env_success)
    seconds = time.perf_counter() - start
    env.close()
    metrics = binary_metrics(torch.cat(predicted), torch.cat(actual))
    return {
        **{k: round(metrics[k], 4) for k in ("accuracy", "precision", "recall")},
        "steps": len(predicted) * NUM_ENVS,
        "steps_per_s": round(len(predicted) * NUM_ENVS / seconds, 1),
    }


def main() -> None:
    def extra(parser):
        parser.add_argument("--cameras", default="front,wrist", help="comma-separated cameras")
        parser.add_argument("--episodes", type=int, default=None, help="generated episodes (default 400, quick 24)")
        parser.add_argument("--epochs", type=float, default=None, help="training epochs (default 6, quick 3)")

    args = parse_args(__doc__, extra)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    import torch

    from robotrl.hil.reward_classifier import binary_metrics, frames_from_episodes, split_episodes
    from robotrl.train_classifier import TrainClassifierConfig, train_and_calibrate

    cameras = args.cameras.split(",")
    num_episodes = args.episodes or (24 if args.quick else 400)
    epochs = args.epochs or (3.0 if args.quick else 6.0)
    start = time.perf_counter()
    episodes = generate_episodes(num_episodes, cameras)
    generate_s = time.perf_counter() - start
    cfg = TrainClassifierConfig(
        datasets=[], out="", cameras=cameras, epochs=epochs, held_out_fraction=0.15, test_fraction=0.15
    )
    train, calibration, test = split_episodes(episodes, cfg.held_out_fraction, cfg.test_fraction, cfg.seed)
    model, report = train_and_calibrate(train, calibration, test, cfg)

    per_mode = {}
    for mode in MODES:
        chosen = [episode for episode in test if episode.metadata["mode"] == mode]
        if chosen:
            frames, labels = frames_from_episodes(chosen, cameras, cfg.frame_stack)
            per_mode[mode] = round(binary_metrics(model.predict(frames), labels)["accuracy"], 4)
    all_labels = torch.cat([torch.cat([torch.zeros(1, dtype=torch.bool), e.success]) for e in episodes])
    figures = {
        "accuracy": round(report["accuracy"], 4),
        "precision": None if report["precision"] is None else round(report["precision"], 4),
        "recall": None if report["recall"] is None else round(report["recall"], 4),
        "frames": int(all_labels.numel()),
        "train_s": round(report["train"]["train_s"], 1),
        "generate_s": round(generate_s, 1),
        "threshold": round(report["threshold"], 4),
        "met_min_precision": report["met_min_precision"],
        "calibration": {k: round(report["held_out"][k], 4) for k in ("accuracy", "precision", "recall")},
        "test_accuracy_by_mode": per_mode,
        "online": online_check(model, cameras, rounds=1 if args.quick else 3, seed=1000),
        "success_frame_share": round(float(all_labels.float().mean()), 3),
        "counts": report["counts"],
        "cameras": cameras,
        "image_size": 64,
        "epochs": epochs,
        "threads": args.threads,
        "quick": args.quick,
        "goal_accuracy": 0.95,
    }
    emit("reward_classifier", figures, args.save)


if __name__ == "__main__":
    main()
