#!/usr/bin/env python3
"""Reads a directory of TensorBoard event files with TensorBoard's own readers, as JSON.

Usage: tools/tb_read.py DIR

Prints {"file_version": ..., "records": {file: n}, "scalars": {tag: [[step, value], ...]}}
on stdout. Every record of every file is first read with TensorBoard's record reader, which
checks both CRCs and fails on a damaged record (the accumulator alone would stop quietly);
then the scalars come from EventAccumulator, as the TensorBoard UI loads them. Non-finite
values are written as the strings "NaN", "inf", "-inf" (JSON has no such numbers).
Exit 0 on success, 1 when a file is damaged, 2 on a usage error.

Needs the `tensorboard` package (python3 -m pip install tensorboard==2.21.0).
"""

import json
import math
import os
import sys


def number(x):
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    directory = sys.argv[1]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    records = {}
    for name in sorted(os.listdir(directory)):
        if "tfevents" not in name:
            continue
        reader = pywrap_tensorflow.PyRecordReader_New(os.path.join(directory, name).encode())
        n = 0
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:
                break
            except errors.DataLossError as e:
                print(f"{name}: record {n}: {e}", file=sys.stderr)
                return 1
            event_pb2.Event.FromString(reader.record())
            n += 1
        records[name] = n

    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {
        tag: [[s.step, number(s.value)] for s in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }
    json.dump(
        {"file_version": acc.file_version, "records": records, "scalars": scalars},
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
