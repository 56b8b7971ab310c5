"""agents.schema: the field names the status collector writes are the dataclasses' fields."""

from __future__ import annotations

from dataclasses import fields

import pytest

from agents import protocol, schema


@pytest.mark.parametrize(
    ("names", "cls"),
    [(schema.HOST_FIELDS, protocol.HostInfo), (schema.GPU_FIELDS, protocol.GpuSnapshot)],
)
def test_field_names_list_the_dataclass_fields_in_order(names, cls):
    assert names == tuple(f.name for f in fields(cls))


def test_protocol_re_exports_the_constants():
    for name in ("SCHEMA_VERSION", "NVML_ERROR_CODES", "CLOCK_EVENT_REASONS", "JOB_STATES"):
        assert getattr(protocol, name) is getattr(schema, name)
