"""Weights stored outside the model file: memory-mapped, never copied (issue 20, scale).

An ONNX model over 2 GB (protobuf's limit) keeps its initializers in files beside it: each
TensorProto has `data_location = EXTERNAL` and `external_data` entries (location, offset,
length). `mapped` maps each such weight read-only from its file (`np.memmap`): loading a 4 GB
model reads none of it; the pages a kernel input or a folded constant touches are read on
demand and shared with the page cache. `initializer` writes a weight back into a proto: a
mapped one as an external-data stub naming its file (a few bytes, not a copy), any other by
value.

>>> import os, tempfile
>>> from onnx import helper, TensorProto
>>> d = tempfile.mkdtemp()
>>> np.arange(6, dtype=np.float32).tofile(os.path.join(d, "w.bin"))
>>> t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3], data_location=TensorProto.EXTERNAL)
>>> for k, v in (("location", "w.bin"), ("offset", "0"), ("length", "24")):
...     e = t.external_data.add(); e.key, e.value = k, v
>>> g = helper.make_graph([], "g", [], [], initializer=[t])
>>> w = mapped(helper.make_model(g), os.path.join(d, "model.onnx"))["w"]
>>> w.tolist(), w.flags.writeable, type(w.base).__name__
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], False, 'memmap')
>>> initializer("w", w).external_data[1].value   # the stub's offset: no bytes copied
'0'
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import zipfile

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from ..errors import ModelError


def external(proto: onnx.ModelProto) -> bool:
    """Whether any initializer of `proto` keeps its data in another file."""
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def mapped(proto: onnx.ModelProto, path: str) -> dict[str, np.ndarray]:
    """name -> a read-only memory map of each external initializer of `proto`, whose model file
    is `path` (locations are relative to its folder and must stay inside it)."""
    base = os.path.dirname(os.path.abspath(path))
    out = {}
    for t in proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        f = os.path.normpath(os.path.join(base, loc))
        if not loc or os.path.isabs(loc) or os.path.commonpath([base, f]) != base:
            raise ModelError(
                f"{path}: weights {t.name!r} name the file {loc!r}, which is not inside the model's folder"
            )
        if not os.path.isfile(f):
            raise ModelError(f"{path}: weights {t.name!r} are in {loc!r}, which is not a file beside the model")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        shape = tuple(int(d) for d in t.dims)
        offset, want = int(info.get("offset", 0)), math.prod(shape) * dtype.itemsize
        length = int(info.get("length", want))
        if length != want or offset + length > os.path.getsize(f):
            raise ModelError(
                f"{path}: weights {t.name!r} ({shape} {dtype.name}: {want} bytes) do not fit {loc!r} at offset "
                f"{offset} (length {length}, file {os.path.getsize(f)} bytes)"
            )
        # a plain ndarray over the map: np.asarray keeps it (a memmap it would rewrap, a new object each time)
        out[t.name] = np.memmap(f, dtype, "r", offset, shape).view(np.ndarray) if want else np.zeros(shape, dtype)
    return out


def load_constants(proto: onnx.ModelProto, path: str) -> None:
    """Read into `proto` the values of its Constant nodes kept in external files (small: an
    exporter's tables, not weights), so that folding evaluates them."""
    base = os.path.dirname(os.path.abspath(path))
    for n in proto.graph.node:
        for a in n.attribute:
            if a.HasField("t") and a.t.data_location == onnx.TensorProto.EXTERNAL:
                try:
                    load_external_data_for_tensor(a.t, base)
                except Exception as e:  # a missing or short file
                    raise ModelError(
                        f"{path}: the value of Constant {n.name or n.output[0]!r} cannot be read: {e}"
                    ) from None
                a.t.data_location = onnx.TensorProto.DEFAULT
                del a.t.external_data[:]


def npz_members(path: str) -> dict[str, np.ndarray]:
    """Each array np.savez stored (uncompressed) in the .npz at `path`, memory-mapped read-only
    from its offset in the file: a deployable folder's weights load without being read. A
    compressed member or one of object dtype is left out (np.load reads it, or refuses it).

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "w.npz")
    >>> np.savez(p, a=np.arange(3.0), b=np.eye(2, dtype=np.float32))
    >>> m = npz_members(p)
    >>> m["a"].tolist(), m["b"].dtype.name, type(m["b"].base).__name__
    ([0.0, 1.0, 2.0], 'float32', 'memmap')
    """
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                continue
            f.seek(info.header_offset)
            head = f.read(30)  # the local file header: its name and extra field precede the data
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                continue
            names, extra = struct.unpack("<HH", head[26:30])
            f.seek(info.header_offset + 30 + names + extra)
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            if dtype.hasobject or f.tell() + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
                continue
            order = "F" if fortran else "C"
            a = np.memmap(path, dtype, "r", f.tell(), shape, order) if math.prod(shape) else np.zeros(shape, dtype)
            out[info.filename[: -len(".npy")]] = a.view(np.ndarray)
    return out


def resolved(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` with the stubs `initializer` wrote read into it (a copy; `proto` itself when it
    has none): for onnx's reference evaluator, which reads only what the proto holds."""
    if not external(proto):
        return proto
    p = onnx.ModelProto()
    p.CopyFrom(proto)
    for t in p.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}  # the stubs name their files by absolute path
            with open(info["location"], "rb") as f:
                f.seek(int(info.get("offset", 0)))
                t.raw_data = f.read(int(info["length"]))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    return p


def _copy_fields(src, dst, skip: str) -> None:
    for fd, v in src.ListFields():
        if fd.name == skip:
            continue
        if hasattr(v, "extend"):  # a repeated field
            getattr(dst, fd.name).extend(v)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(v)
        else:
            setattr(dst, fd.name, v)


def without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` without its initializers, made without copying them (the deployable
    folder's graph.onnx: copying the whole proto to drop them held the weights three times).

    >>> from onnx import helper
    >>> g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(np.zeros(4), "w")])
    >>> p = without_initializers(helper.make_model(g))
    >>> len(p.graph.initializer), p.graph.name
    (0, 'g')
    """
    g = onnx.GraphProto()
    _copy_fields(proto.graph, g, "initializer")
    p = onnx.ModelProto()
    _copy_fields(proto, p, "graph")
    p.graph.CopyFrom(g)
    return p


def initializer(name: str, a: np.ndarray) -> onnx.TensorProto:
    """`a` as an initializer named `name`: a memory-mapped weight as an external-data stub naming
    its file by absolute path (readers of the in-memory proto resolve it), any other by value."""
    m = a.base if isinstance(a, np.ndarray) and isinstance(a.base, np.memmap) else None
    if m is None or not isinstance(m.base, mmap.mmap) or m.filename is None or (a.shape, a.dtype) != (m.shape, m.dtype):
        return numpy_helper.from_array(np.asarray(a), name)  # not a whole mapped weight: by value
    t = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(a.dtype), dims=a.shape)
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", m.filename), ("offset", str(m.offset)), ("length", str(m.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t
