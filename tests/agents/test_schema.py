"""agents.schema: the field names the status collector writes are the dataclasses' fields."""

from __future__ import annotations

from dataclasses import fields

import pytest

from agents import protocol, schema


@pytest.mark.parametrize(
    ("names", "cls"),
    [
        (schema.HOST_FIELDS, protocol.HostInfo),
        (schema.GPU_FIELDS, protocol.GpuSnapshot),
        (schema.PROCESS_FIELDS, protocol.ProcessSnapshot),
    ],
)
def test_field_names_list_the_dataclass_fields_in_order(names, cls):
    assert names == tuple(f.name for f in fields(cls))


def test_protocol_re_exports_the_constants():
    for name in ("SCHEMA_VERSION", "NVML_ERROR_CODES", "CLOCK_EVENT_REASONS", "JOB_STATES"):
        assert getattr(protocol, name) is getattr(schema, name)


def test_an_older_agents_documents_still_parse():
    """Fields added later default to None, so a status or who from an agent that predates them
    parses (the bot replaces the agent, but reads what it prints first)."""
    gpu = {name: None for name in schema.GPU_FIELDS[: schema.GPU_FIELDS.index("fan_speed_pct")]}
    gpu.update(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3", pci_bus_id="0:18:0")
    parsed = protocol.from_dict(protocol.GpuSnapshot, gpu)
    assert (parsed.fan_speed_pct, parsed.pstate, parsed.enc_util_pct) == (None, None, None)
    proc = protocol.from_dict(
        protocol.ProcessSnapshot,
        {"gpu_index": 0, "pid": 7, "user": None, "command": None, "used_mem_bytes": None},
    )
    assert (proc.sm_util_pct, proc.cpu_pct, proc.elapsed_s) == (None, None, None)
    who = protocol.loads(
        protocol.WhoReport, '{"schema": 1, "gpus": [{"index": 0, "name": "x", "processes": []}]}'
    )
    assert who.gpus[0].held_by is None
    assert who.waiting_any == ()
