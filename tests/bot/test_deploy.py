"""deploy/: the image's entrypoint run for real (the key copied private, the bot run as its own
user), the image built from digest-pinned bases and hash-checked pins and run as a user that is
not root, the pins in constraints.txt matching what is installed, the compose file's database
password kept out of its URL, the SSH key kept out of git and the image's context, and the
systemd units' user and sandbox as `systemd-sysusers` and `systemd-analyze security` see them."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sqlalchemy import make_url

from bot.errors import ConfigError
from bot.settings import Settings

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
    # A copy in ``base``, which every user may enter: the checkout itself may sit in a private
    # directory (a 0700 home) that the user switched to cannot read.
    script = base / "entrypoint.sh"
    shutil.copyfile(ENTRYPOINT, script)
    script.chmod(0o755)
    argv = ["sh", str(script), "socket", "--flag"]
    if as_uid is not None:
        argv = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", *argv]
    return subprocess.run(
        argv, env=env, cwd=base, capture_output=True, text=True, timeout=30, check=False
    )


def _open_to_all(path: Path) -> bool:
    """Whether every user may enter ``path`` and each directory above it."""
    return all(part.stat().st_mode & stat.S_IXOTH for part in (path, *path.parents))


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own are private to root, and so may be
    TMPDIR): made in the first temporary directory open to all."""
    candidates = [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]
    parent = next((c for c in candidates if c.is_dir() and _open_to_all(c)), None)
    if parent is None:
        pytest.skip("no temporary directory here that every user may enter")
    path = Path(tempfile.mkdtemp(prefix="gpubot-entrypoint-", dir=parent))
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


def _dockerfile() -> list[tuple[str, str]]:
    """deploy/Dockerfile as (INSTRUCTION, arguments) pairs: continuations joined, comments out."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        word, _, rest = whole.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def _stages() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """The ARG defaults declared before the first FROM, and the instructions of each stage
    (each list starting with its FROM)."""
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _dockerfile():
        if word == "FROM":
            stages.append([])
        if not stages:
            assert word == "ARG", f"{word} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        stages[-1].append((word, rest))
    return args, stages


def test_every_base_image_is_pinned_by_digest() -> None:
    args, stages = _stages()
    names: set[str] = set()
    assert len(stages) >= 2, "a build stage and a final stage"
    for stage in stages:
        _word, rest = stage[0]
        image, _, alias = rest.partition(" AS ")
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], image.strip())
        if image not in names:
            assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", image), f"FROM {image}"
        if alias:
            names.add(alias.strip())
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "image" in service:
            assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", service["image"]), name


def test_the_image_runs_as_its_own_user_with_its_own_home() -> None:
    _args, stages = _stages()
    final = stages[-1]
    words = [word for word, _ in final]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage names a USER"
    assert all(user.split(":")[0] not in ("root", "0") for user in users)
    first_user = words.index("USER")
    assert first_user < words.index("ENTRYPOINT")
    assert first_user < words.index("CMD")
    # Nothing is copied from the build context or another stage after the switch (what the
    # user may change is made for it by install -o below), nor run before it but one RUN.
    assert [w for w in words[:first_user] if w == "RUN"] == ["RUN"]
    env = " ".join(rest for word, rest in final if word == "ENV")
    home = re.search(r"\bHOME=(\S+)", env)
    mplconfig = re.search(r"\bMPLCONFIGDIR=(\S+)", env)
    assert home is not None
    assert mplconfig is not None
    assert mplconfig[1].startswith(home[1] + "/")
    made = next(rest for word, rest in final if word == "RUN")
    assert "-o gpubot -g gpubot" in made
    for directory in (home[1], mplconfig[1], "/data", "/run/gpubot"):
        assert f" {directory} " in f" {made} ", directory
    uid = users[0].split(":")[0]
    assert f"--uid {uid}" in made
    # Only what runs: no compiler, no apt, no source tree in the final stage.
    assert not any("apt-get" in rest or "pip install" in rest for _, rest in final)
    assert all(
        "--from=build" in rest or rest.startswith("deploy/") for w, rest in final if w == "COPY"
    )


def test_the_image_installs_only_hash_checked_pins() -> None:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    installs = re.findall(r"pip install [^&\n]*", text)
    for command in installs:
        if "--requirement" in command or " -r " in command:
            assert "--require-hashes" in command, command
        else:
            assert "--no-deps" in command, command  # gpubot's own wheel, built here
    assert "requirements.lock" in text
    assert "build.lock" in text


def _lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A lock file's pins: name -> (version, its sha256 hashes)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = re.match(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        assert found is not None, f"{path.name}: not an exact pin: {line}"
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
        pins[canonicalize_name(found[1])] = (found[2], hashes)
    return pins


def test_the_lock_hashes_every_package_and_covers_what_pyproject_requires() -> None:
    from deploy.constraints import runtime_pins

    pins = _lock(DEPLOY / "requirements.lock")
    assert all(hashes for _version, hashes in pins.values()), "every pin has its hashes"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for line in project["project"]["dependencies"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not locked: run deploy/lock.sh"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), line
    # The same versions as constraints.txt and this environment, and nothing more.
    assert {name: version for name, (version, _) in pins.items()} == runtime_pins()


def test_the_build_lock_covers_the_build_backend() -> None:
    pins = _lock(DEPLOY / "build.lock")
    assert all(hashes for _version, hashes in pins.values())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for line in project["build-system"]["requires"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not locked: run deploy/lock.sh"
        assert requirement.specifier.contains(pins[name][0]), line


def test_compose_passes_the_database_password_apart_from_the_url() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    env = compose["services"]["bot"]["environment"]
    url = env["GPUBOT_DATABASE_URL"]
    assert "$" not in url
    assert urllib.parse.urlsplit(url).password is None
    assert env["GPUBOT_DATABASE_PASSWORD"].startswith("${POSTGRES_PASSWORD")
    assert compose["services"]["db"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD"
    )
    # What the bot makes of them with a password that would break a URL written by hand.
    password = "p@ss:w/rd?#%"
    settings = Settings.from_env({"GPUBOT_DATABASE_URL": url, "GPUBOT_DATABASE_PASSWORD": password})
    assert settings.database_url is not None
    parsed = make_url(settings.database_url)
    assert (parsed.username, parsed.password, parsed.host, parsed.port) == (
        "gpubot",
        password,
        "db",
        5432,
    )
    assert parsed.database == "gpubot"


@pytest.mark.parametrize(
    "url",
    [None, "sqlite:////data/gpubot.sqlite3", "postgresql+psycopg://db:5432/gpubot"],
)
def test_a_database_password_without_a_user_to_give_it_to_is_refused(url: str | None) -> None:
    env = {"GPUBOT_DATABASE_PASSWORD": "secret"}
    if url is not None:
        env["GPUBOT_DATABASE_URL"] = url
    with pytest.raises(ConfigError, match="GPUBOT_DATABASE_PASSWORD"):
        Settings.from_env(env)


def test_a_database_password_replaces_one_in_the_url() -> None:
    settings = Settings.from_env(
        {
            "GPUBOT_DATABASE_URL": "postgresql://bot:old@127.0.0.1/gpubot",
            "GPUBOT_DATABASE_PASSWORD": "n@w",
        }
    )
    assert settings.database_url == "postgresql://bot:n%40w@127.0.0.1/gpubot"


def test_the_units_user_is_created_by_sysusers(tmp_path: Path) -> None:
    sysusers = DEPLOY / "systemd" / "gpubot.sysusers"
    declared = {
        line.split()[1]
        for line in sysusers.read_text().splitlines()
        if line.strip() and not line.startswith("#") and line.split()[0] == "u"
    }
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        (user,) = re.findall(r"^User=(\S+)$", text, flags=re.M)
        (group,) = re.findall(r"^Group=(\S+)$", text, flags=re.M)
        assert {user, group} <= declared, unit.name
        assert "gpubot.sysusers" in text, f"{unit.name} says where its user comes from"
    tool = shutil.which("systemd-sysusers")
    if tool is None:
        pytest.skip("needs systemd-sysusers")
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (tmp_path / "etc" / name).touch()
    done = subprocess.run(
        [tool, f"--root={tmp_path}", str(sysusers)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and os.geteuid() != 0:
        pytest.skip(f"systemd-sysusers needs root here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    entry = next(line for line in passwd.splitlines() if line.startswith("gpubot:"))
    assert entry.endswith(":/var/lib/gpubot:/usr/sbin/nologin")
    assert "gpubot:" in (tmp_path / "etc" / "group").read_text()
