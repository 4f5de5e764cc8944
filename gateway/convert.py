"""fast.v1 messages as plain JSON-able values, read off the descriptors.

Unlike protobuf's json_format, 64-bit integers stay numbers, unset optional and message fields
become None, and non-finite floats (an explained variance of constant returns is NaN) become
None, so that every answer is valid JSON that the OpenAPI schema describes.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name if value in field.enum_type.values_by_number else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return None  # weights and models travel as downloads, never inside JSON
    return value


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_plain(value)
    return _scalar(field, value)


def to_plain(message: Message) -> dict[str, Any]:
    """Every field of `message` by its proto name; repeated as lists, maps as dicts."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {key: _value(value_field, item) for key, item in value.items()}
        elif field.is_repeated:
            out[field.name] = [_value(field, item) for item in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out


def enum_word(full_name: str, prefix: str) -> str:
    """RUN_STATE_PAUSED -> "paused"."""
    return full_name.removeprefix(prefix).lower()
