"""The sshd fixture's login accounts, as ``bench/fleet_status.py`` makes them: twenty servers
started four at a time, each asking for the same account on a machine that has none yet."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures.sshd import ensure_login_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can add an account")


def test_an_account_asked_for_by_many_threads_at_once_is_made_once_and_owns_its_home() -> None:
    name = f"gb{uuid.uuid4().hex[:10]}"
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            made = list(pool.map(lambda _: ensure_login_user(name), range(8)))
        account = pwd.getpwnam(name)
        assert {m.pw_uid for m in made} == {account.pw_uid}
        home = Path(account.pw_dir).stat()
        assert (home.st_uid, home.st_gid) == (account.pw_uid, account.pw_gid)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
