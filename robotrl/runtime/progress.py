"""Live progress bar: env steps, steps/s, latest episode return and success rate."""

from __future__ import annotations

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, initial: int, enabled: bool = True):
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=not enabled,
            mininterval=0.5,
            smoothing=0.05,
        )
        self._fields: dict[str, str] = {}

    def advance(self, steps: int) -> None:
        self._bar.update(steps)

    def show_train(self, scalars: dict[str, float]) -> None:
        if "train/episode_return" in scalars:
            self._fields["return"] = f"{scalars['train/episode_return']:.1f}"
        if "train/success" in scalars:
            self._fields["success"] = f"{scalars['train/success']:.0%}"
        self._bar.set_postfix(self._fields, refresh=False)

    def show_eval(self, result: dict[str, float]) -> None:
        self._fields["eval"] = f"{result['return']:.1f}"
        if "success" in result:
            self._fields["eval_success"] = f"{result['success']:.0%}"
        self._bar.set_postfix(self._fields, refresh=False)

    def close(self) -> None:
        self._bar.close()
