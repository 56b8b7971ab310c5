"""The contract between the bot and the agent for job errors, diagnoses and notes: every
error code the agent can give is one the bot reads, each told by a template the catalogue
translates with the same placeholders, through the JSON document the agent prints; and an
agent before those documents is shown in its own English."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agents import jobs_cli, messages, runner
from agents.gpu_queue import resolve_request
from agents.jobstore import JobStore
from agents.nvml import HINTS
from agents.protocol import (
    JobError,
    JobFailure,
    JobRecord,
    JobRequestError,
    NvmlError,
    dumps,
    loads,
    parse_gpus,
)
from bot import i18n
from bot.errors import AgentBroken, UsageError
from bot.fleet.agent_client import AgentRefused, _failure
from bot.fleet.base import ExecResult
from bot.i18n import placeholders, speaking
from bot.services.jobs import runs as svc
from bot.services.speaking import agent_text
from bot.store.models import Instance
from tests.chinese import assert_chinese

ROOT = Path(__file__).resolve().parents[4]
BOX = cast(Instance, SimpleNamespace(name="box"))


def _raised(make: Callable[[], object]) -> JobError:
    with pytest.raises(JobError) as raised:
        make()
    return raised.value


def _request(tmp_path: Path, **changes: Any) -> runner.RunRequest:
    values: dict[str, Any] = {"command": ("true",), "cwd": str(tmp_path)}
    values.update(changes)
    return runner.RunRequest(**values)


def _check(tmp_path: Path, **changes: Any) -> Callable[[], object]:
    return lambda: runner._check_request(_request(tmp_path, **changes), os.environ)


def _finished_job(tmp_path: Path) -> Callable[[], object]:
    store = JobStore(str(tmp_path / "home"))
    store.ensure()
    with store.locked():
        job_id = store.create({"state": "succeeded", "command": ["true"], "seq": 1})
    return lambda: runner.cancel(store, job_id, grace_s=0.1)


def agent_errors(tmp_path: Path) -> dict[str, JobError]:
    """One error of every code, each made by the agent's own code."""
    store = JobStore(str(tmp_path / "empty"))
    store.ensure()
    return {
        "gpus_not_understood": _raised(lambda: parse_gpus("2gpus")),
        "gpus_twice": _raised(lambda: parse_gpus("0,0")),
        "gpus_any_count": _raised(lambda: parse_gpus("any:0")),
        "gpus_missing": _raised(lambda: resolve_request(parse_gpus("3"), [0, 1], "")),
        "gpus_too_many": _raised(lambda: resolve_request(parse_gpus("any:3"), [0, 1], "")),
        "no_usable_gpu": _raised(lambda: resolve_request(parse_gpus("0"), [], "NVML failed")),
        "nvml_failed": runner.nvml_failure(NvmlError("gpu_lost", "Xid 79", HINTS["gpu_lost"])),
        "no_command": _raised(_check(tmp_path, command=())),
        "retries_range": _raised(_check(tmp_path, retries=101)),
        "env_form": _raised(_check(tmp_path, env=(("1A", "x"),))),
        "env_reserved": _raised(_check(tmp_path, env=(("CUDA_VISIBLE_DEVICES", "0"),))),
        "cwd_missing": _raised(_check(tmp_path, cwd=str(tmp_path / "nowhere"))),
        "not_executable": _raised(_check(tmp_path, command=("./nothing",))),
        "command_not_found": _raised(_check(tmp_path, command=("no-such-program-here",))),
        "since_form": _raised(
            lambda: jobs_cli.cmd_jobs(argparse.Namespace(since="yesterday", json=True))
        ),
        "job_finished": _raised(_finished_job(tmp_path)),
        "supervisor_failed": JobError.said(
            "supervisor_failed", messages.SUPERVISOR_FAILED, error=OSError("fork failed")
        ),
        "job_not_found": _raised(lambda: store.resolve("nope")),
        "job_failed": JobError("could not pick a new job id; try again"),
        "bad_request": JobRequestError("a request told in English only"),
    }


def test_every_code_the_agent_gives_is_one_the_bot_reads(tmp_path: Path) -> None:
    made = agent_errors(tmp_path)
    assert set(made) == set(messages.ERROR_TEMPLATES)
    for code, error in made.items():
        assert error.code == code
        assert error.template in (None, *messages.ERROR_TEMPLATES[code]), code


def test_every_template_has_its_chinese_with_the_same_placeholders() -> None:
    zh = i18n.catalogue("zh")
    templates = {t for ts in messages.ERROR_TEMPLATES.values() for t in ts}
    templates |= {
        value
        for key, value in vars(messages).items()
        if key.startswith(("NOTE_", "DIAGNOSIS_")) and isinstance(value, str)
    }
    for template in templates:
        assert template in zh, template
        assert placeholders(zh[template]) == placeholders(template), template


def test_every_error_crosses_as_a_document_and_reads_in_both_languages(tmp_path: Path) -> None:
    for code, error in agent_errors(tmp_path).items():
        failure = loads(JobFailure, dumps(error.failure()))
        assert (failure.code, failure.message, failure.exit_code) == (
            code,
            str(error),
            error.exit_code,
        )
        english = agent_text.said(failure.template, failure.params, failure.message, name="box")
        with speaking("zh"):
            chinese = agent_text.said(failure.template, failure.params, failure.message, name="box")
        if failure.template is None:  # told in English only: shown as it is
            assert english == chinese == failure.message
            continue
        agent_said = failure.message.replace("this machine", "box")
        assert english.rstrip(".").lower() == agent_said.rstrip(".").lower(), code
        assert chinese != english, code
        assert_chinese(chinese.replace("Xid 79", "Xid"))


def _agent_cli(tmp_path: Path, *args: str) -> ExecResult:
    env = {**os.environ, "GPU_AGENT_HOME": str(tmp_path / "agent"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "agents", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    return ExecResult(done.returncode, done.stdout, done.stderr)


def test_the_bot_reads_the_agents_refusal_from_its_command_line(tmp_path: Path) -> None:
    result = _agent_cli(tmp_path, "run", "--json", "--gpus", "0,0", "--", "true")
    assert result.exit_code == 2
    assert "gpu-agent: error: --gpus '0,0' names a GPU twice" in result.stderr
    failure = _failure(result)
    assert failure is not None
    assert failure.code == "gpus_twice"
    refused = AgentRefused("box: gpu-agent run failed", failure=failure, instance="box")
    with speaking("zh"):
        shown = svc._agent_error(refused, BOX)
    assert isinstance(shown, UsageError)
    assert_chinese(shown.message)
    assert "'0,0'" in shown.message
    english = svc._agent_error(refused, BOX)
    assert english.message == "--gpus '0,0' names a GPU twice; give each GPU once."


def test_an_nvml_failure_names_the_instance_and_is_not_a_usage_error(tmp_path: Path) -> None:
    error = runner.nvml_failure(NvmlError("driver_not_loaded", "nvmlInit failed", "Reboot."))
    refused = AgentRefused("box: gpu-agent who failed", failure=error.failure(), instance="box")
    shown = svc._agent_error(refused, BOX)
    assert isinstance(shown, AgentBroken)
    assert not isinstance(shown, AgentRefused)
    assert shown.message.startswith("The NVIDIA driver on box is installed but not loaded")


def test_an_old_agents_english_is_shown_as_it_is() -> None:
    said = (
        "this machine has 2 GPUs (0, 1); --gpus 3 names GPU 3, which it does not have. "
        "--gpus takes GPU indices as CUDA_VISIBLE_DEVICES does"
    )
    old = AgentBroken(
        f"box: gpu-agent run failed with exit code 2\ngpu-agent: error: {said}", instance="box"
    )
    for language in ("en", "zh"):
        with speaking(language):  # type: ignore[arg-type]
            shown = svc._agent_error(old, BOX)
        assert isinstance(shown, UsageError)
        assert shown.message == said
    unrelated = AgentBroken("box: gpu-agent run failed with exit code 1", instance="box")
    assert svc._agent_error(unrelated, BOX) is unrelated


def test_notes_cross_as_template_and_parameters_and_old_notes_read_as_written() -> None:
    base = JobRecord(
        id="j",
        name=None,
        state="lost",
        command=("true",),
        user=None,
        gpus_requested=None,
        gpus_assigned=(),
        retries=0,
        attempt=0,
        created_at="2026-12-02T12:00:00+00:00",
        started_at=None,
        finished_at=None,
        exit_code=None,
    )
    fields = runner.note_fields(messages.NOTE_SUPERVISOR_FAILED, error=OSError("no memory"))
    noted = loads(JobRecord, dumps(base.__class__(**{**base.__dict__, **fields})))
    assert noted.note == "could not start the job's supervisor: no memory"
    with speaking("zh"):
        chinese = svc.note_words(noted)
        gone = svc.note_words(
            loads(
                JobRecord,
                dumps(base.__class__(**{**base.__dict__, "note": "cancelled while queued"})),
            )
        )
        old = svc.note_words(base.__class__(**{**base.__dict__, "note": "killed by SIGKILL"}))
    assert chinese is not None
    assert gone is not None
    assert_chinese(chinese, gone)
    assert "no memory" in chinese
    assert old == "killed by SIGKILL"
    assert svc.note_words(noted) == noted.note
