# TensorBoard's side of --tensorboard_dir (support/tensorboard.h). Two jobs:
#
#   python3 dev/reference/check_tensorboard.py --golden
#       writes test/fixtures/tensorboard/: golden.tfevents, an event file written by
#       TensorBoard's own EventFileWriter (the file_version record, scalar events as
#       torch.utils.tensorboard's add_scalar makes them, a text event as its add_text
#       makes it), and golden.json, what it holds. test/test_tensorboard.c reads the file
#       with its own reader (CRCs recomputed by an independent bitwise CRC-32C) and
#       checks that our writer encodes the same events to the same bytes.
#
#   python3 dev/reference/check_tensorboard.py TB_DIR METRICS_JSONL
#       reads a run's event files with TensorBoard's EventAccumulator (whose record
#       reader verifies both CRCs of every record) and checks every scalar against the
#       metrics file's value at the same step, the configuration text, and that a copy
#       of the file cut in the middle of its last record still reads up to the record
#       before. Tolerance: one float32 ulp. The event holds the float32 of the trainer's
#       double, the metrics file that double printed to 9 digits; the two roundings of one
#       double differ by at most one float32 ulp (tokens/s is printed to 3 decimals: 0.0005
#       more), where a wrong value (another step's, another quantity) is off by far more.
#
# Needs tensorboard (PyPI; 2.21.0 used). Deterministic but for wall_time.
import glob, json, os, shutil, struct, sys, tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

OUT = os.path.join("test", "fixtures", "tensorboard")
# Hugging Face Trainer's names and ours (train/tokens_per_second, train/peak_memory_mib, train/mfu)
KEYS = {"train/loss": "loss", "train/learning_rate": "lr", "train/grad_norm": "grad_norm",
        "train/tokens_per_second": "tok_per_s", "train/mfu": "mfu", "eval/loss": "val_loss"}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def ulp32(x):  # the spacing of float32 at x
    b = struct.unpack("<I", struct.pack("<f", abs(f32(x))))[0]
    return struct.unpack("<f", struct.pack("<I", b + 1))[0] - abs(f32(x))


def golden():
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    w = EventFileWriter(tmp)  # writes the file_version record itself
    scalars = [(1, {"train/loss": 6.25, "train/learning_rate": 5e-3}), (2, {"train/loss": 5.875, "eval/loss": -0.1})]
    for step, values in scalars:  # as add_scalar: Summary.Value(tag, simple_value), one event a step
        s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        w.add_event(event_pb2.Event(step=step, wall_time=1.5e9, summary=s))
    text = "| option | value |\n|---|---|\n| lr | 0.005 |"
    tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    w.add_event(event_pb2.Event(step=0, wall_time=1.5e9, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="config", metadata=meta, tensor=tensor)])))
    w.close()
    (path,) = glob.glob(os.path.join(tmp, "events.out.tfevents.*"))
    shutil.copy(path, os.path.join(OUT, "golden.tfevents"))
    json.dump({"scalars": [[step, values] for step, values in scalars], "text": {"step": 0, "tag": "config", "text": text}},
              open(os.path.join(OUT, "golden.json"), "w"), indent=1)
    shutil.rmtree(tmp)
    print(f"wrote {OUT}/golden.tfevents ({os.path.getsize(os.path.join(OUT, 'golden.tfevents'))} bytes) and golden.json")


def accumulate(d):
    ea = EventAccumulator(d, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def events(ea):  # every event's (wall_time, tag, value), in the order written
    ev = [(e.wall_time, t, e.value) for t in ea.Tags()["scalars"] for e in ea.Scalars(t)]
    return sorted(ev + [(e.wall_time, t, None) for t in ea.Tags()["tensors"] for e in ea.Tensors(t)])


def check(tb_dir, metrics):
    records = [json.loads(l) for l in open(metrics)]
    ea = accumulate(tb_dir)
    bad = n = 0
    for tag, key in KEYS.items():
        want = {r["step"]: r[key] for r in records if r.get(key) is not None}
        got = {e.step: e.value for e in ea.Scalars(tag)} if tag in ea.Tags()["scalars"] else {}
        if set(want) != set(got):
            print(f"FAIL {tag}: steps {sorted(got)} in the events, {sorted(want)} in the metrics")
            bad += 1
        for step in set(want) & set(got):
            n += 1
            if abs(want[step] - got[step]) > ulp32(want[step]) + (5e-4 if key == "tok_per_s" else 0):
                print(f"FAIL {tag} at step {step}: {got[step]!r} in the events, {want[step]!r} in the metrics")
                bad += 1
    config = ea.Tensors("config")[0].tensor_proto.string_val[0].decode() if "config" in ea.Tags()["tensors"] else ""
    if not config.startswith("| option | value |"):
        print("FAIL: no configuration text")
        bad += 1
    # a killed run: the file cut inside its last record reads up to the record before
    (path,) = glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))
    with tempfile.TemporaryDirectory() as cut:
        data = open(path, "rb").read()
        open(os.path.join(cut, os.path.basename(path)), "wb").write(data[:-7])
        whole, part = events(ea), events(accumulate(cut))
        if part != whole[:len(part)] or len(part) != len(whole) - 1:
            print(f"FAIL: the cut file read {len(part)} of the {len(whole)} events, or others")
            bad += 1
    print(f"{'FAIL' if bad else 'ok'}: {n} scalars equal to the metrics file's, CRCs verified by TensorBoard's reader, "
          f"configuration text present, a cut file readable to its last whole record")
    return bad


if __name__ == "__main__":
    if sys.argv[1:] == ["--golden"]:
        golden()
    elif len(sys.argv) == 3:
        sys.exit(1 if check(sys.argv[1], sys.argv[2]) else 0)
    else:
        sys.exit(__doc__ or "usage: check_tensorboard.py --golden | TB_DIR METRICS_JSONL")
