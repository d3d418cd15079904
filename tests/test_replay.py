import pytest
import torch

from robotrl.data import ReplayBuffer, TensorSpec

SPEC = {"state": TensorSpec((2,))}


def _add(buf, t, terminated=False, truncated=False, env_offset=100.0):
    """Add one step whose obs encodes the step index t (and env index e as t + e*env_offset)."""
    e = torch.arange(buf.num_envs, dtype=torch.float32)
    value = t + e * env_offset
    obs = {"state": torch.stack([value, torch.zeros_like(value)], 1)}
    next_obs = {"state": torch.stack([value + 0.5, torch.zeros_like(value)], 1)}
    n = buf.num_envs
    buf.add(
        obs,
        torch.full((n, 1), float(t)),
        torch.full((n,), float(t)),
        next_obs,
        torch.full((n,), terminated),
        torch.full((n,), truncated),
    )


def test_ring_overwrites_oldest_and_reports_size():
    buf = ReplayBuffer(SPEC, 1, capacity=5)
    for t in range(7):
        _add(buf, t)
    assert len(buf) == 5 and buf.full and buf.pos == 2
    stored = sorted(buf.obs["state"][:, 0, 0].tolist())
    assert stored == [2, 3, 4, 5, 6]


def test_sampling_is_uniform_over_stored_rows_and_envs():
    buf = ReplayBuffer(SPEC, 1, capacity=40, num_envs=4)
    for t in range(10):
        _add(buf, t)
    batch = buf.sample(20_000)
    values = batch.obs["state"][:, 0]
    counts = torch.bincount(values.long(), minlength=400)[values.long().unique()]
    assert len(counts) == 40
    assert counts.float().std() / counts.float().mean() < 0.15
    # action, reward and next_obs come from the same transition as obs
    t = values % 100
    assert torch.equal(batch.action[:, 0], t)
    assert torch.equal(batch.reward[:, 0], t)
    assert torch.equal(batch.next_obs["state"][:, 0], values + 0.5)


def _nstep_for_all(buf):
    """Sample enough to see every row and map obs value -> (reward, discount, next_obs value)."""
    batch = buf.sample(5000)
    out = {}
    for o, r, d, n in zip(
        batch.obs["state"][:, 0], batch.reward[:, 0], batch.discount[:, 0], batch.next_obs["state"][:, 0], strict=True
    ):
        out[int(o)] = (float(r), float(d), float(n))
    return out


def test_n_step_stops_at_termination_without_bootstrap_and_at_truncation_with_it():
    g = 0.5
    buf = ReplayBuffer(SPEC, 1, capacity=100, n_step=3, gamma=g)
    # episode A: steps 0,1,2 (terminated at 2); episode B: steps 3,4 (truncated at 4); episode C: 5,6,7
    for t in range(8):
        _add(buf, t, terminated=(t == 2), truncated=(t == 4))
    res = _nstep_for_all(buf)
    assert res[0] == pytest.approx((0 + g * 1 + g**2 * 2, 0.0, 2.5))  # ends in termination: no bootstrap
    assert res[1] == pytest.approx((1 + g * 2, 0.0, 2.5))
    assert res[2] == pytest.approx((2, 0.0, 2.5))
    assert res[3] == pytest.approx((3 + g * 4, g**2, 4.5))  # truncation: bootstrap from the final obs
    assert res[4] == pytest.approx((4, g, 4.5))
    assert res[5] == pytest.approx((5 + g * 6 + g**2 * 7, g**3, 7.5))
    # the newest steps only sum what has been stored and bootstrap from the newest next_obs
    assert res[6] == pytest.approx((6 + g * 7, g**2, 7.5))
    assert res[7] == pytest.approx((7, g, 7.5))


def test_n_step_across_wrap_around_never_reaches_overwritten_rows():
    g = 0.9
    buf = ReplayBuffer(SPEC, 1, capacity=4, n_step=3, gamma=g)
    for t in range(6):  # rows now hold steps 4, 5, 2, 3 -- step 3's successor 4 sits at row 0
        _add(buf, t)
    res = _nstep_for_all(buf)
    assert set(res) == {2, 3, 4, 5}
    assert res[2] == pytest.approx((2 + g * 3 + g**2 * 4, g**3, 4.5))
    assert res[3] == pytest.approx((3 + g * 4 + g**2 * 5, g**3, 5.5))
    assert res[5] == pytest.approx((5, g, 5.5))  # newest step: nothing after it, rows 2,3 are older


def test_n_step_follows_each_env_separately():
    g = 0.5
    buf = ReplayBuffer(SPEC, 1, capacity=20, num_envs=2, n_step=2, gamma=g)
    for t in range(3):
        _add(buf, t)
    res = _nstep_for_all(buf)
    assert res[100] == pytest.approx((0 + g * 1, g**2, 101.5))  # env 1's own successor, not env 0's


def test_state_dict_round_trip_keeps_only_filled_rows():
    buf = ReplayBuffer(SPEC, 1, capacity=50, n_step=2)
    for t in range(7):
        _add(buf, t, terminated=(t == 3))
    state = buf.state_dict()
    assert state["obs.state"].shape[0] == 7
    other = ReplayBuffer(SPEC, 1, capacity=50, n_step=2)
    other.load_state_dict(state)
    assert other.pos == buf.pos and other.full == buf.full
    assert torch.equal(other.obs["state"], buf.obs["state"])
    assert torch.equal(other.terminated, buf.terminated)
    # the resumed run restarts its episodes: the newest row ends one (bootstrapped, as a time limit)
    assert other.truncated[6].all() and not buf.truncated[6].any()
    assert torch.equal(other.truncated[:6], buf.truncated[:6])
    _add(other, 7)
    _, discount, last = other._n_step(torch.tensor([6]), torch.tensor([0]))
    assert last.item() == 6 and discount.item() == pytest.approx(0.99)  # no sum into the new episode
    with pytest.raises(ValueError, match="rows per env"):
        ReplayBuffer(SPEC, 1, capacity=60).load_state_dict(state)


def test_bad_arguments_name_the_setting():
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(SPEC, 1, capacity=10, n_step=0)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(SPEC, 1, capacity=0)
    with pytest.raises(ValueError, match=r"n_step=5 does not fit a replay of 2 steps per env \(replay_capacity=4"):
        ReplayBuffer(SPEC, 1, capacity=4, num_envs=2, n_step=5)
    buf = ReplayBuffer(SPEC, 1, capacity=10)
    with pytest.raises(ValueError, match=r"observation\['state'\]"):
        buf.check_step({"state": torch.zeros(1, 3)}, torch.zeros(1, 1))
    with pytest.raises(ValueError, match="action"):
        buf.check_step({"state": torch.zeros(1, 2)}, torch.zeros(1, 2))
    with pytest.raises(RuntimeError, match="empty"):
        buf.sample(4)
