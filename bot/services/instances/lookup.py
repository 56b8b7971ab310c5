"""Finding instances and reaching them: the lookups every instance and job service shares.

Lookups see only what this runtime may see (bot.services.access: ``local`` only in the
console). A host key that changed (HostKeyChanged from any fleet call) alerts the owner once
per presented key: a Prompt of kind ``host_key_changed`` keyed by its fingerprint, saying
:class:`HostKeyAlert`; the fleet refuses the instance until it is registered again from the
same address, which pins the new key.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col, select

from agents import specs
from agents.protocol import ProtocolError, StatusSnapshot, dumps, from_dict
from bot import billing
from bot.errors import Conflict, FleetError, GpubotError, HostKeyChanged, NotFound
from bot.fleet import keys
from bot.fleet.base import HostKey, Target
from bot.i18n import N_, nt, speaking, t
from bot.notify import Notice
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services import access
from bot.services.instances import releases
from bot.services.instances.views import GpuView, InstanceView, Mismatch, SettingsView
from bot.services.speaking import nvml_words, prompts
from bot.services.speaking.people import language_for
from bot.store.models import Instance, Person

log = logging.getLogger(__name__)

#: Instances that are asked for their live status; the others are shown as stored.
POLLED_STATES = ("active",)
#: The prompt kind of a host key alert; its key is the presented fingerprint.
KIND_HOST_KEY_CHANGED = "host_key_changed"
#: How many characters of a user's word a message echoes; longer ones end in an ellipsis.
ECHO_MAX = 40
#: What a host key alert presents, and keys its prompt by, when no key of the pinned type came.
NO_PINNED_KEY = N_("no key of the pinned type")
_GIB = 1024**3
#: The layout of :func:`facts_json` (a stored value of another version is derived again).
FACTS_VERSION = 1


@dataclass(frozen=True)
class StatusFacts:
    """What the views show of a status snapshot, derived once when it is stored: its GPUs, the
    catalogue key of the spec each GPU matched (None: no whole GPU of the catalogue; see
    ``agents.specs.match``) and why NVML failed (its code and the driver's message)."""

    gpus: tuple[GpuView, ...]
    spec_keys: tuple[str | None, ...]
    nvml_code: str | None = None
    nvml_message: str | None = None

    @property
    def util_pct(self) -> int | None:
        """The GPUs' mean utilisation, rounded to a whole percent; None when none reports it."""
        utils = [g.util_pct for g in self.gpus if g.util_pct is not None]
        return round(sum(utils) / len(utils)) if utils else None


@dataclass(frozen=True)
class HostKeyAlert(Notice):
    """To the owner: ``instance`` presented the host key ``presented`` (a fingerprint, or words
    saying none of the pinned type) instead of the pinned ``expected``; the bot refuses it
    until it is registered again."""

    instance: InstanceView
    expected: str
    presented: str


def echo(text: str, limit: int = ECHO_MAX) -> str:
    """The user's ``text`` as a message echoes it: at most ``limit`` characters, then "…"."""
    return text if len(text) <= limit else text[:limit] + "…"


def presented_text(presented: str) -> str:
    """What a host key alert says was presented: the fingerprint, or (for
    :data:`NO_PINNED_KEY`) those words in the active language."""
    return t(NO_PINNED_KEY) if presented == NO_PINNED_KEY else presented


def instance_by_id(rt: Runtime, instance_id: int) -> InstanceView:
    """An instance by id (button values carry ids). Raises NotFound."""
    with rt.db.session() as session:
        return instance_view(by_id(rt, session, instance_id))


def get_live_instance(rt: Runtime, session: Session, name: str) -> Instance:
    """The instance called ``name`` that is not released and that this runtime may see (see
    bot.services.access). Raises NotFound with a hint."""
    inst = access.visible(rt, live_by_name(session, name))
    if inst is None:
        raise NotFound(
            t("There is no instance called {name!r}.", name=echo(name)),
            hint=t("`/gpu list` shows the instances; names are lowercase."),
        )
    return inst


def live_by_name(session: Session, name: str) -> Instance | None:
    """The registration called ``name`` that is not released, whoever may see it."""
    return session.exec(
        select(Instance).where(Instance.name == name, Instance.state != "released")
    ).first()


def by_name_any(rt: Runtime, session: Session, name: str) -> Instance:
    """The live instance called ``name``, else its last released registration. Raises
    NotFound."""
    found = access.visible(rt, live_by_name(session, name))
    if found is not None:
        return found
    released = access.visible(
        rt,
        session.exec(
            select(Instance).where(Instance.name == name).order_by(col(Instance.id).desc())
        ).first(),
    )
    if released is None:
        return get_live_instance(rt, session, name)
    return released


def by_id(rt: Runtime, session: Session, instance_id: int) -> Instance:
    """The instance with this id, released or not, that this runtime may see. Raises
    NotFound."""
    inst = access.visible(rt, session.get(Instance, instance_id))
    if inst is None:
        raise NotFound(
            t("There is no instance with id {id}.", id=instance_id),
            hint=t("`/gpu list` shows the instances."),
        )
    return inst


def target_for(rt: Runtime, inst: Instance) -> Target:
    """How the fleet reaches a stored instance (its pinned key, key file, Python, agent home).
    A key no longer in the key directory fails when the fleet dials (AuthenticationFailed)."""
    host_key = None
    if inst.host_key_b64 and inst.host_key_type:
        host_key = HostKey(
            key_type=inst.host_key_type,
            key_b64=inst.host_key_b64,
            fingerprint=inst.host_key_fingerprint or "",
        )
    key_path = inst.ssh_key_path
    if inst.ssh_key_name:
        key_path = str(keys.stored_key_path(rt.settings, inst.ssh_key_name))
    return Target(
        name=inst.name,
        host=inst.host,
        port=inst.port,
        user=inst.ssh_user,
        key_path=key_path,
        host_key=host_key,
        python_path=inst.python_path,
        agent_home=inst.agent_home,
    )


def handle_fleet_error(rt: Runtime, inst: Instance, exc: FleetError) -> None:
    """React to a failed fleet call: a changed host key alerts the owner (once per presented
    key), in the owner's language. Never raises; the caller re-raises or shows ``exc``."""
    if not isinstance(exc, HostKeyChanged) or inst.id is None:
        return
    presented = exc.presented_fingerprint or NO_PINNED_KEY
    try:
        language = language_for(rt, inst.owner_id)
        with rt.db.session() as session:
            prompt = prompts.ensure_prompt(
                session,
                instance_id=inst.id,
                kind=KIND_HOST_KEY_CHANGED,
                key=presented[:128],
                recipient=inst.owner_id,
                due_at=rt.now(),
            )
            prompt_id = prompt.id
        assert prompt_id is not None
        with speaking(language):
            alert = HostKeyAlert(
                instance=instance_view(inst),
                expected=inst.host_key_fingerprint or exc.expected_fingerprint or t("unknown"),
                presented=presented_text(presented),
            )
            text, body = rt.message(alert)
        prompts.deliver(rt, prompt_id, text, body)
    except Exception:  # an alert must never hide the error the caller shows
        log.exception("alerting the owner of %s about a changed host key failed", inst.name)


def instance_view(inst: Instance) -> InstanceView:
    """The view of a stored instance."""
    return InstanceView(
        id=inst.id or 0,
        name=inst.name,
        owner_id=inst.owner_id,
        state=inst.state,
        provider=inst.provider,
        provider_instance_id=inst.provider_instance_id,
        host=inst.host,
        port=inst.port,
        ssh_user=inst.ssh_user,
        project=inst.project,
        gpu_model=inst.gpu_model,
        gpu_count=inst.gpu_count,
        delivered_gpu_name=inst.delivered_gpu_name,
        delivered_gpu_count=inst.delivered_gpu_count,
        price_micros_per_hour=billing.hourly_cost_micros(inst),
        currency=inst.currency,
        created_at=inst.created_at,
        deadline_at=inst.deadline_at,
        lifetime_cap_at=inst.lifetime_cap_at,
        host_key_fingerprint=inst.host_key_fingerprint,
        python_path=inst.python_path,
        agent_version=inst.agent_version,
        channel_id=inst.channel_id,
        stopped_at=inst.stopped_at if inst.state == releases.STOPPED else None,
        storage_micros_per_hour=billing.storage_micros_per_hour(inst),
    )


def settings_view(inst: Instance) -> SettingsView:
    """The instance's settings; billing as :func:`bot.billing.rules_for` applies it (the
    platform's increment and minimum where the registration gave none)."""
    platform = platform_billing(inst.provider)
    rules = billing.rules_for(inst, platform)
    return SettingsView(
        name=inst.name,
        at_deadline=inst.deadline_policy,
        max_grace_s=inst.max_grace_s,
        idle_release_after_s=inst.idle_release_after_s,
        release_when_done=inst.release_when_done,
        lifetime_cap_at=inst.lifetime_cap_at,
        billing_increment=rules.increment,
        min_charge_s=rules.min_charge_s,
        disk_gb=inst.disk_gb,
        storage_micros_per_gb_month=inst.storage_micros_per_gb_month,
        currency=inst.currency,
        unverified_increment=billing.unverified_increment(inst, platform),
    )


def compare_gpus(
    expected_model: str | None, expected_count: int | None, status: StatusSnapshot
) -> Mismatch | None:
    """What differs between the rented GPUs and the delivered ones (fewer cards, another model,
    less memory per card), or None when they agree or nothing was expected."""
    return compare_facts(expected_model, expected_count, status_facts(status))


def compare_facts(
    expected_model: str | None, expected_count: int | None, facts: StatusFacts
) -> Mismatch | None:
    """:func:`compare_gpus` from the stored facts of a snapshot (no spec is matched again)."""
    if expected_model is None and expected_count is None:
        return None
    problems: list[str] = []
    delivered = len(facts.gpus)
    if facts.nvml_code is not None:
        error = nvml_words.described(facts.nvml_code, facts.nvml_message or "")
        problems.append(t("no GPU is visible: {error}", error=error))
    elif expected_count is not None and delivered < expected_count:
        problems.append(
            t(
                "fewer cards: {delivered} delivered, {rented} rented",
                delivered=delivered,
                rented=expected_count,
            )
        )
    if expected_model:
        problems.extend(_model_problems(expected_model, facts))
    if not problems:
        return None
    return Mismatch(
        expected_model=expected_model,
        expected_count=expected_count,
        delivered_names=tuple(g.name for g in facts.gpus),
        problems=tuple(problems),
    )


def gpu_views(status: StatusSnapshot) -> tuple[GpuView, ...]:
    """The GPUs of a status snapshot."""
    return tuple(
        GpuView(
            index=g.index,
            name=g.name,
            util_pct=g.util_gpu_pct,
            mem_used_bytes=g.mem_used_bytes,
            mem_total_bytes=g.mem_total_bytes,
            temp_c=g.temp_c,
            power_w=g.power_draw_w,
        )
        for g in status.gpus
    )


def status_facts(status: StatusSnapshot) -> StatusFacts:
    """The facts views show of ``status``, each GPU matched against the spec catalogue."""
    error = status.nvml_error
    return StatusFacts(
        gpus=gpu_views(status),
        spec_keys=tuple(_spec_key(g.name, g.mem_total_bytes, g.sm_count) for g in status.gpus),
        nvml_code=error.code if error is not None else None,
        nvml_message=error.message if error is not None else None,
    )


def status_columns(status: StatusSnapshot) -> dict[str, object]:
    """The Instance columns that store a status snapshot: the snapshot itself and what views
    read of it (:func:`status_facts`, its mean utilisation and GPU count), so that no view
    parses the snapshot or matches a spec."""
    facts = status_facts(status)
    return {
        "last_status_json": dumps(status),
        "status_facts_json": facts_json(facts),
        "status_util_pct": facts.util_pct,
        "status_gpu_count": len(facts.gpus),
    }


def facts_json(facts: StatusFacts) -> str:
    """``facts`` as stored: compact JSON (a list per GPU)."""
    return json.dumps(
        {
            "v": FACTS_VERSION,
            "gpus": [
                [
                    g.index,
                    g.name,
                    g.util_pct,
                    g.mem_used_bytes,
                    g.mem_total_bytes,
                    g.temp_c,
                    g.power_w,
                    key,
                ]
                for g, key in zip(facts.gpus, facts.spec_keys, strict=True)
            ],
            "nvml": None
            if facts.nvml_code is None
            else [facts.nvml_code, facts.nvml_message or ""],
        },
        separators=(",", ":"),
    )


def facts_from_json(text: str) -> StatusFacts | None:
    """Stored facts (see :func:`facts_json`); None when the text is not of this layout."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != FACTS_VERSION:
            return None
        gpus = []
        keys: list[str | None] = []
        for index, name, util, used, total, temp, power, key in data["gpus"]:
            gpus.append(GpuView(index, name, util, used, total, temp, power))
            keys.append(key)
        nvml = data.get("nvml")
        code, message = (None, None) if nvml is None else (str(nvml[0]), str(nvml[1]))
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return StatusFacts(tuple(gpus), tuple(keys), nvml_code=code, nvml_message=message)


def stored_facts(inst: Instance) -> StatusFacts | None:
    """What the last stored status of ``inst`` says, for views: its stored facts, derived from
    the snapshot only for a row stored before facts were (or in another layout); None without
    a readable snapshot."""
    if not inst.last_status_json:
        return None
    if inst.status_facts_json:
        facts = facts_from_json(inst.status_facts_json)
        if facts is not None:
            return facts
    snapshot = stored_status(inst)
    return status_facts(snapshot) if snapshot is not None else None


def stored_status(inst: Instance) -> StatusSnapshot | None:
    """The last stored status snapshot of ``inst``, parsed; None when none is readable."""
    if not inst.last_status_json:
        return None
    try:
        return from_dict(StatusSnapshot, json.loads(inst.last_status_json))
    except (ValueError, ProtocolError):
        return None


def ensure_person(session: Session, slack_id: str, display_name: str | None) -> None:
    """Add the person if unknown (a concurrent insert is fine); learn a display name Slack sent
    for someone known without one."""
    known = session.get(Person, slack_id)
    if known is not None:
        if display_name and not known.display_name:
            known.display_name = display_name
        return
    try:
        with session.begin_nested():
            session.add(Person(slack_id=slack_id, display_name=display_name))
    except sa_exc.IntegrityError:
        if session.get(Person, slack_id) is None:
            raise


def local_agent_home(rt: Runtime) -> str:
    """Where the agent of the instance ``local`` keeps its state: in the bot's data dir."""
    return str(rt.settings.data_dir / "local-agent")


def require_active(inst: Instance, what: str) -> None:
    """Raise Conflict unless the instance is active; ``what`` completes "it cannot be ..." (in
    the active language)."""
    if inst.state == "active":
        return
    raise Conflict(
        t(
            "{name} is {state}; it cannot be {what} now.",
            name=inst.name,
            state=access.state_words(inst.state),
            what=what,
        )
    )


def is_manual(rt: Runtime, inst: Instance) -> bool:
    """Whether a person releases the instance on its platform (no id, or no release API)."""
    if not inst.provider_instance_id:
        return True
    try:
        return not rt.providers.get(inst.provider).capabilities.api_release
    except GpubotError:  # an unconfigured provider: the release attempt will say so
        return False


def _model_problems(expected_model: str, facts: StatusFacts) -> list[str]:
    wanted = _candidates(expected_model)
    if not wanted or not facts.gpus:
        return []
    keys = {spec.key for spec in wanted}
    least_mem = min(spec.mem_min_bytes for spec in wanted)
    problems: list[str] = []
    seen: set[str] = set()
    for gpu, key in zip(facts.gpus, facts.spec_keys, strict=True):
        found = _spec(key)
        label = gpu.name
        problem: str | None = None
        if gpu.mem_total_bytes is not None and gpu.mem_total_bytes < least_mem:
            problem = t(
                "less memory: {gpu} has {memory:.0f} GiB, the rented {model} has {least} GiB "
                "or more",
                gpu=label,
                memory=gpu.mem_total_bytes / _GIB,
                model=expected_model,
                least=min(spec.mem_gb for spec in wanted),
            )
        elif found is None:
            problem = t(
                "another model: {gpu} is not a whole {model}", gpu=label, model=expected_model
            )
        elif found.key not in keys:
            problem = t(
                "another model: {gpu} instead of {model}", gpu=found.name, model=expected_model
            )
        if problem is not None and problem not in seen:
            seen.add(problem)
            count = sum(1 for g in facts.gpus if g.name == gpu.name)
            problems.append(
                problem
                if count == 1
                else nt(
                    "{problem} ({n} card)", "{problem} ({n} cards)", count, problem=problem, n=count
                )
            )
    return problems


# The catalogue is fixed for the life of the process, so what a name means is asked once.
@lru_cache(maxsize=512)
def _candidates(model: str) -> tuple[specs.GpuSpec, ...]:
    return specs.candidates(model)


@lru_cache(maxsize=512)
def _spec(key: str | None) -> specs.GpuSpec | None:
    return None if key is None else specs.by_key(key)


@lru_cache(maxsize=2048)
def _spec_key(name: str, mem_total_bytes: int | None, sm_count: int | None) -> str | None:
    found = specs.match(name, mem_total_bytes, sm_count)
    return None if found is None else found.key


def can_start(rt: Runtime, inst: Instance | InstanceView) -> bool:
    """Whether the bot can start the stopped instance on its platform (a button can)."""
    if not inst.provider_instance_id:
        return False
    try:
        return rt.providers.get(inst.provider).capabilities.can_start
    except GpubotError:
        return False
