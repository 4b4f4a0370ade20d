"""Picklable verifiers for tests (spawned scoring workers import them by module path)."""

import os
import time

from reasonrl.reward.verifier_protocol import RewardResult


class DigitFraction:
    """A trivially learnable reward: the fraction of response characters that are digits."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        score = sum(ch.isdigit() for ch in response) / max(1, len(response))
        return RewardResult(score, score > 0.5)


class RaisesOn:
    """Raises for responses containing ``marker``; else scores 1 if the response equals the reference."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, response: str, reference: str) -> RewardResult:
        if self.marker in response:
            raise ValueError(f"cannot score {response!r}")
        return RewardResult(float(response == reference), response == reference)


class HangsOn(RaisesOn):
    """Sleeps forever for responses containing ``marker``."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        if self.marker in response:
            time.sleep(3600)
        return super().__call__(response.replace(self.marker, ""), reference)


class ExitsOn(RaisesOn):
    """Kills its own process for responses containing ``marker``."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        if self.marker in response:
            os._exit(3)
        return super().__call__(response, reference)


class HangsSometimes:
    """Hangs on one response in eight (by its hash), scores digit fraction otherwise."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        if sum(map(ord, response)) % 8 == 0:
            time.sleep(3600)
        return DigitFraction()(response, reference)


class ResponseLength:
    """A dense reward: the response's length in characters / 100 (non-zero from the first step)."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        return RewardResult(len(response) / 100, False)


class Constant:
    """The same score for every response, whatever it says: no learning signal."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        return RewardResult(0.0, False)
