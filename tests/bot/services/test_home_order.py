"""The Home lists its person's instances nearest deadline first, from the store: the first
screenful (with their buttons) holds the nearest deadlines, whatever order they were stored
in."""

from __future__ import annotations

import json
from datetime import timedelta

from bot.blocks.home import MINE_SHOWN
from bot.blocks.home import home_view as render_home
from bot.services.home import home_view
from bot.store.db import Database
from tests.bot.services.support import T0, Clock, add_instance, make_runtime

ALICE = "UALICE"
BOB = "UBOB"


def test_an_owner_of_thirty_sees_the_nearest_deadlines_first_and_none_hidden(
    db: Database,
) -> None:
    rt = make_runtime(db, Clock(T0))
    hours = [(n * 11) % 30 + 1 for n in range(30)]  # 1..30 h, stored out of order
    for n, h in enumerate(hours):
        add_instance(db, name=f"a{n:02d}", owner_id=ALICE, deadline_at=T0 + timedelta(hours=h))
    add_instance(db, name="a-open", owner_id=ALICE, deadline_at=None)
    add_instance(db, name="b-soonest", owner_id=BOB, deadline_at=T0 + timedelta(minutes=5))
    view = home_view(rt, ALICE)
    assert len(view.mine) == 31
    deadlines = [item.deadline_at for item in view.mine]
    assert deadlines[-1] is None
    dated = [at for at in deadlines if at is not None]
    assert dated == sorted(dated)
    assert dated[0] == T0 + timedelta(hours=1)
    assert "b-soonest" not in {item.name for item in view.mine}

    blocks = render_home(view)["blocks"]
    first = {
        int(block["block_id"].removeprefix("home-inst-"))
        for block in blocks
        if block.get("block_id", "").startswith("home-inst-")
    }
    assert first == {item.id for item in view.mine[:MINE_SHOWN]}
    text = json.dumps(blocks)
    assert f"{31 - MINE_SHOWN} more instances, with later deadlines" in text
    assert "`/gpu status` lists them all." in text
