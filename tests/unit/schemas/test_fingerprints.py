"""The single-object fingerprints on the wire are fastavro's CRC-64-AVRO, and they have not moved: every
record already on a topic (and every reader deployed) names its writer schema by these bytes."""

from __future__ import annotations

from schemas.codec import crc64_avro, schema_set

# The fingerprints of the current writer schemas and of the older writer versions still read, as
# computed by the project's own CRC-64-AVRO before fastavro's replaced it.
PINNED = {
    "caca072f938c38c5": "rolloutbus.Span",
    "128d59c7a0dfac62": "rolloutbus.RolloutEvent",
    "0b8e8ae02cb8bec1": "rolloutbus.Task",
    "231a8c4d5edd09dc": "rolloutbus.Transition",
    "4deb88e85d894157": "rolloutbus.GroupBatch",
    "289cfc8e0a559376": "rolloutbus.ResourceVersion",
    "4154bb696ccab82c": "rolloutbus.TrainStep",
    "39efaa7bb910ae54": "rolloutbus.DeadLetter",
    "5e556460e0d8df51": "rolloutbus.Feedback",
    "ca1a77fa732fa698": "rolloutbus.Span",  # history/span.v1.avsc
}


def test_the_fingerprints_on_the_wire_are_unchanged() -> None:
    assert {fp.hex(): name for fp, (name, _) in schema_set().writers.items()} == PINNED


def test_crc64_avro_is_the_spec_fingerprint() -> None:
    # The Avro specification's test vectors: the fingerprints of the schemas "null" and "int".
    assert crc64_avro(b'"null"') == 0x63DD24E7CC258F8A
    assert crc64_avro(b'"int"') == 0x7275D51A3F395C8F
