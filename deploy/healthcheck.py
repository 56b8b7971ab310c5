"""The container's health check: exit 0 when gpubot is ready, 1 when it is not, 2 for a bad URL.

``python healthcheck.py [URL]`` asks URL (default ``http://127.0.0.1:9464/readyz``, the ops
endpoints' own listener in both modes; the Slack port answers ``/slack/events`` alone) and
prints what it answered: one line per readiness check. Standard library only.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:9464/readyz"
TIMEOUT_S = 8.0


def check(url: str, *, timeout_s: float = TIMEOUT_S) -> int:
    """0 when ``url`` answers 200, 1 when it answers anything else or nothing, 2 when it is no
    http(s) URL; prints the answer."""
    if not url.startswith(("http://", "https://")):
        print(f"{url!r} is not an http:// or https:// URL")
        return 2
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - checked
            print(response.read().decode("utf-8", "replace"), end="")
            return 0 if response.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(exc.read().decode("utf-8", "replace"), end="")
        return 1
    except OSError as exc:
        print(f"gpubot is not answering at {url}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(check(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL))
