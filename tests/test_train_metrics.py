"""What a run's `MetricsLogger` shows: the plain progress lines' ETA (seconds left at the pace of this process's
steps so far), and a resumed run's TensorBoard event files (each step once, read file by file)."""

import json
import time
from pathlib import Path

from jaxformer.train.metrics import MetricsLogger


def test_plain_eta_is_paced_by_the_steps_not_the_compile(tmp_path, monkeypatch, capsys):
    """A resumed segment that spends 30 s restoring and compiling, then trains 10 steps in 5 s, has 90 steps left:
    45 s at 0.5 s a step (counting the 30 s as the steps' pace, as the ETA did, said 5m15s: 35 s / 10 × 90)."""
    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    logger = MetricsLogger(tmp_path, start_step=20, total_steps=120, progress="plain", tensorboard=False)
    now[0] += 30.0  # restore and compile, before the first step is dispatched
    for _ in range(10):
        logger.advance()
        now[0] += 0.5
    logger.log({"step": 30, "train_loss": 2.0})
    for _ in range(10):
        logger.advance()
        now[0] += 0.5
    now[0] += 1.0  # an evaluation at step 40: part of the pace, as evaluations recur
    logger.log({"step": 40, "train_loss": 1.5, "val_loss": 1.75})
    for _ in range(80):
        logger.advance()
    logger.log({"step": 120, "train_loss": 1.0})  # the last step: no ETA
    logger.close()
    assert capsys.readouterr().out.splitlines() == [
        "step 30/120 | loss 2.0000 | ETA 0m45s",
        "step 40/120 | loss 1.5000 | val 1.7500 | ETA 0m44s",  # 11 s / 20 steps × 80
        "step 120/120 | loss 1.0000",
    ]


def read_event_files(logdir: Path) -> list[list]:
    """Each event file's ``Event`` protos in order, read one file at a time as tbparse does, every record's two
    masked CRCs checked (TFRecord framing: length, CRC, event, CRC); a record cut short ends a file, as it does
    for TensorBoard's reader."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    files = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, events, offset = path.read_bytes(), [], 0
        while offset < len(data):
            header = data[offset:offset + 8]
            length = int.from_bytes(header, "little")
            if offset + 12 + length + 4 > len(data):
                break
            body = data[offset + 12:offset + 12 + length]
            assert int.from_bytes(data[offset + 8:offset + 12], "little") == masked_crc32c(header)
            end = offset + 12 + length
            assert int.from_bytes(data[end:end + 4], "little") == masked_crc32c(body)
            events.append(Event.FromString(body))
            offset = end + 4
        files.append(events)
    return files


def test_resumed_tensorboard_files_hold_each_step_once(tmp_path):
    """A run killed at step 8 (its last record cut short), resumed from its checkpoint at step 5: read file by file,
    the event files hold steps 1-5 of the first segment and 6-10 of the second, each once (they held 6-8 twice)."""
    first = MetricsLogger(tmp_path, start_step=0, total_steps=10, progress="none", tensorboard=True)
    for step in range(1, 9):
        first.log({"step": step, "train_loss": float(step)})
    first.close()
    (old,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    with open(old, "ab") as handle:  # the kill: a record's length written, not the record
        handle.write((40).to_bytes(8, "little"))
    time.sleep(1.1)  # the second writer's file is named by the second it opens in
    second = MetricsLogger(tmp_path, start_step=5, total_steps=10, progress="none", tensorboard=True)
    for step in range(6, 11):
        second.log({"step": step, "train_loss": 100.0 + step})
    second.close()

    files = read_event_files(tmp_path / "tensorboard")
    assert len(files) == 2 and all(events[0].file_version == "brain.Event:2" for events in files)
    scalars = [(value.tag, event.step, value.simple_value) for events in files for event in events
               for value in event.summary.value]
    assert scalars == [("train_loss", step, float(step)) for step in range(1, 6)] + [
        ("train_loss", step, 100.0 + step) for step in range(6, 11)]
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": step, "train_loss": float(step)} for step in range(1, 6)] + [
        {"step": step, "train_loss": 100.0 + step} for step in range(6, 11)]
