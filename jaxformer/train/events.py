"""A resumed run's TensorBoard event files: the summaries past the restored step are dropped from those written before.

A killed run has logged steps past its last checkpoint; the resumed run logs them again. The resumed writer's restart
marker (tensorboardX's ``purge_step``) has TensorBoard's own reader drop the old ones, but a reader that takes each
event file alone (tbparse, a pandas pipeline, another dashboard's importer) would see those steps twice, as
``metrics.jsonl`` would without its truncation (`jaxformer.train.metrics.truncate_rows`). So the old files lose them.

An event file is a sequence of TFRecords: an 8-byte little-endian length, a 4-byte masked CRC of it, the serialized
``Event``, a 4-byte masked CRC of that. Kept records are copied byte for byte; a record cut short by a kill ends the
file there.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from jaxformer.files import write_bytes_atomic

EVENT_FILES = "events.out.tfevents.*"


def records(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(record, event)`` for each whole TFRecord of ``data``: its bytes as framed, and the serialized event."""
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + 12 + length + 4
        if end > len(data):
            return
        yield data[offset:end], data[offset + 12 : offset + 12 + length]
        offset = end


def drop_summaries_after(logdir: Path, last_step: int) -> None:
    """Rewrites each event file in ``logdir`` (atomically, where anything changes) without its summaries of steps
    past ``last_step``; other events (the file version, restart markers) are kept. Imports tensorboardX, whose
    package imports PyTorch when it is installed (`jaxformer.train.metrics` imports it without)."""
    from tensorboardX.proto.event_pb2 import Event

    for path in sorted(Path(logdir).glob(EVENT_FILES)):
        data = path.read_bytes()
        kept = bytearray()
        for record, serialized in records(data):
            event = Event.FromString(serialized)
            if not (event.HasField("summary") and event.step > last_step):
                kept += record
        if len(kept) != len(data):
            write_bytes_atomic(path, bytes(kept))
