"""deploy/: the image's entrypoint run for real (the key copied private, the bot run as its own
user), the pins in constraints.txt matching what is installed, the SSH key kept out of git and
the image's context, and the systemd units' sandbox as `systemd-analyze security` rates it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
NOBODY = 65534


def _fake_gpubot(bin_dir: Path) -> None:
    """A `gpubot` on PATH that reports who runs it and the key it was given."""
    bin_dir.mkdir()
    script = bin_dir / "gpubot"
    script.write_text(
        "#!/bin/sh\n"
        'echo "uid=$(id -u) args=$* key=$GPUBOT_SSH_KEY '
        'mode=$(stat -c %a "$GPUBOT_SSH_KEY") owner=$(stat -c %u "$GPUBOT_SSH_KEY")"\n'
        'cat "$GPUBOT_SSH_KEY"\n'
    )
    script.chmod(0o755)


def _entrypoint(
    base: Path, key: Path, *, as_uid: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{base / 'bin'}:{os.environ['PATH']}",
        "GPUBOT_SSH_KEY": str(key),
        "GPUBOT_KEY_COPY_DIR": str(base / "run" / "gpubot"),
        "GPUBOT_RUN_AS": "nobody",
    }
    argv = ["sh", str(ENTRYPOINT), "socket", "--flag"]
    if as_uid is not None:
        argv = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpubot-entrypoint-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@needs_root
def test_as_root_the_key_is_copied_private_and_the_bot_runs_as_its_user(open_dir: Path) -> None:
    base = open_dir
    _fake_gpubot(base / "bin")
    (base / "run").mkdir()
    key = base / "secret_key"
    key.write_text("PRIVATE KEY\n")
    key.chmod(0o600)  # root's, unreadable by the bot's user: as compose mounts a file secret
    done = _entrypoint(base, key)
    assert done.returncode == 0, done.stderr
    copy = base / "run" / "gpubot" / "ssh_key"
    assert done.stdout.splitlines() == [
        f"uid={NOBODY} args=socket --flag key={copy} mode=600 owner={NOBODY}",
        "PRIVATE KEY",
    ]
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # the original is left as it was


@needs_root
def test_as_another_user_an_unreadable_key_stops_with_a_clear_message(open_dir: Path) -> None:
    base = open_dir
    _fake_gpubot(base / "bin")
    run = base / "run"
    run.mkdir()
    os.chown(run, NOBODY, NOBODY)
    key = base / "secret_key"
    key.write_text("PRIVATE KEY\n")
    key.chmod(0o600)
    done = _entrypoint(base, key, as_uid=NOBODY)
    assert done.returncode == 2
    assert f"cannot read the SSH key {key} as UID {NOBODY}" in done.stderr
    assert done.stdout == ""

    key.chmod(0o644)  # readable: copied 0600 for that user, who runs the bot
    done = _entrypoint(base, key, as_uid=NOBODY)
    assert done.returncode == 0, done.stderr
    assert f"uid={NOBODY} args=socket --flag" in done.stdout
    assert "mode=600" in done.stdout


def test_constraints_pin_what_is_installed() -> None:
    """constraints.txt is what deploy/constraints.py writes for this environment: regenerate it
    after changing a dependency."""
    from deploy.constraints import runtime_pins

    text = (ROOT / "constraints.txt").read_text()
    pinned = dict(re.findall(r"^([a-z0-9-]+)==(\S+)$", text, flags=re.M))
    assert pinned == runtime_pins()
    assert "prometheus-client" in pinned
    assert not {"pytest", "ruff", "mypy", "moto", "gpubot"} & set(pinned)


def test_the_ssh_key_stays_out_of_git_and_of_the_image() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/ssh/id_ed25519"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0
    patterns = (ROOT / ".dockerignore").read_text().split()
    for needed in ("**/.venv", "deploy/ssh", "**/.env", "**/id_ed25519*"):
        assert needed in patterns
    assert "!deploy/.env.example" in patterns


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("unit", ["gpubot.service", "gpubot-http.service"])
def test_the_units_are_sandboxed(unit: str) -> None:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(DEPLOY / "systemd" / unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    if found is None and "offline" in done.stderr:
        pytest.skip("this systemd-analyze has no --offline")
    assert found is not None, done.stdout + done.stderr
    assert float(found[1]) < 2.0
    text = (DEPLOY / "systemd" / unit).read_text()
    assert "LoadCredential=ssh_key:/etc/gpubot/ssh_key" in text
    assert "Environment=GPUBOT_SSH_KEY=%d/ssh_key" in text
