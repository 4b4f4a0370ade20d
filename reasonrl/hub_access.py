"""Whether the Hugging Face Hub answers, asked once before a hub model or dataset is loaded.

Without a network, huggingface_hub retries every file it cannot fetch five times, with back-off, and
logs each try (a hub model id: ~70 s and 60 lines before its error; a hub dataset: ~33 s).  One short
request to the Hub first tells a machine without a network apart, so that a load fails at once, with
a line that says what to do, or comes from the local cache alone (a model: its cached snapshot).
Nothing is asked when ``HF_HUB_OFFLINE=1``: the libraries then use their caches without a network.
"""

from __future__ import annotations

import functools


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached from here, as a clause for an error message; None when it answers
    (or when ``HF_HUB_OFFLINE=1`` asks not to try).  The Hub is asked once per endpoint and process,
    waiting at most ``HF_HUB_ETAG_TIMEOUT`` seconds (huggingface_hub's wait for a file's metadata)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    return _ask(constants.ENDPOINT, constants.HF_HUB_ETAG_TIMEOUT)


@functools.cache
def _ask(endpoint: str, timeout_s: float) -> str | None:
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint, timeout=timeout_s)  # any answer, an HTTP error too, means reachable
    except Exception as exc:  # no route, no name resolution, a refused or timed-out connection, a failing proxy
        return f"the Hugging Face Hub ({endpoint}) cannot be reached ({type(exc).__name__}: {exc})"
    return None


def cached_snapshot(repo_id: str) -> str:
    """The directory of a hub model's copy in the local Hugging Face cache, found without asking the Hub;
    an OSError when the cache holds none."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, local_files_only=True)
