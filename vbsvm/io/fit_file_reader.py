"""The reading half of :func:`vbsvm.load`: runs in a child process, with bounded memory and time.

:func:`vbsvm.io.fit_file.read_fit_file` starts this module as a script
(``python -I -B -S fit_file_reader.py FD LIMITS PATHS``), on the already opened fit file (descriptor
``FD``). It imports only the standard library, numpy, h5py and h5netcdf, never vbsvm, so that a
file which makes libhdf5 hang, crash or allocate without bound costs the child process, which
the parent kills after its time limit, never the caller.

Before anything is read, the child

* caps its own address space, CPU time and file writes (``resource.setrlimit``: ``RLIMIT_AS``,
  ``RLIMIT_CPU``, ``RLIMIT_FSIZE = 0``) and runs with HDF5 plugins disabled;
* walks every link and object of the file (:func:`inspect`): only hard links, groups and
  datasets, no object linked twice, no named datatypes; every dataset contiguous, compact or
  chunked (no virtual layout), with no external storage, only the deflate, shuffle and
  fletcher32 filters, a simple or scalar dataspace of at most :data:`MAX_RANK` dimensions and a
  plain numeric or variable-length text type; every attribute small and of a plain type;
* sums the bytes the datasets declare and refuses a file that declares more than the parent's
  bound.

The protocol on the pipes: the child writes messages (8-byte little-endian length, then JSON)
to stdout. First the structure (:func:`describe`): root attributes, and per group its
attributes and datasets (shape, dtype, dims, attributes). The parent checks it and answers on
stdin with one JSON line naming the variables to read (or ``null``: stop). The child then reads
them and writes an index message followed by the raw bytes of the numeric arrays (text arrays
are in the index), and a last message with its peak memory. Errors are a message
``{"error": text}``. The parent never unpickles anything from the child.

:func:`content_digest` (the checksum a saved fit carries) is computed from the same structures
by :meth:`vbsvm.results.fit.Fit.save` (in-process, on the file it just wrote) and by the parent
after a read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
import time

#: Most dimensions a dataset may have.
MAX_RANK = 8
#: Most links (groups and datasets) in a file.
MAX_OBJECTS = 100_000
#: Most attributes on one object.
MAX_ATTRIBUTES = 64
#: Most bytes one attribute may declare (numeric data, or 16 per variable-length string).
MAX_ATTRIBUTE_BYTES = 1 << 20
#: Longest text attribute (characters), as :data:`vbsvm.io.fit_file.MAX_ATTRIBUTE_CHARS`.
MAX_ATTRIBUTE_CHARS = 10_000_000
#: Longest object name (characters).
MAX_NAME = 255
#: Largest chunk a chunked dataset may declare (bytes).
MAX_CHUNK_BYTES = 64 << 20
#: Bytes a variable-length string element takes in the file's raw data (its heap pointer).
VLEN_BYTES = 16
#: Attributes that hold HDF5 object references (netCDF's dimension scales) and nothing else.
REFERENCE_ATTRIBUTES = ("DIMENSION_LIST", "REFERENCE_LIST")
#: Name of the root attribute that holds :func:`content_digest`.
CHECKSUM_ATTRIBUTE = "vbsvm_checksum"

_NUMERIC_SIZES = {"i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8)}


class Refusal(Exception):
    """The file is not what a fit file may be (message: what and where)."""


# ===================================================================== wire format
def write_message(stream, obj):
    """Write ``obj`` as one message: its JSON's length (8 bytes, little-endian), then the JSON."""
    data = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode()
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def read_exactly(stream, n):
    """``n`` bytes from ``stream`` (a bytearray); ``EOFError`` if it ends first."""
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            raise EOFError(f"the stream ended after {got} of {n} bytes")
        got += k
    return out


def read_message(stream, limit):
    """One message from ``stream``; ``ValueError`` if it is longer than ``limit`` bytes."""
    (n,) = struct.unpack("<Q", bytes(read_exactly(stream, 8)))
    if n > limit:
        raise ValueError(f"a message of {n} bytes (at most {limit})")
    return json.loads(bytes(read_exactly(stream, n)))


# ===================================================================== attributes
def encode_attribute(value, where):
    """A JSON form of an attribute value: ``["str", text]`` or ``["num", dtype, shape, values]``."""
    import numpy as np

    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(f"{where} is text that is not UTF-8.") from None
    if isinstance(value, str):
        if len(value) > MAX_ATTRIBUTE_CHARS:
            raise Refusal(f"{where} has {len(value)} characters (at most {MAX_ATTRIBUTE_CHARS}).")
        return ["str", value]
    arr = np.asarray(value)
    if arr.dtype.kind not in _NUMERIC_SIZES:
        raise Refusal(f"{where} has the unsupported type {arr.dtype}.")
    return ["num", arr.dtype.str, list(arr.shape), arr.ravel().tolist()]


def decode_attribute(encoded):
    """The value of :func:`encode_attribute`'s form (text, or a numpy array)."""
    import numpy as np

    if (isinstance(encoded, list) and len(encoded) == 2 and encoded[0] == "str"
            and isinstance(encoded[1], str)):
        return encoded[1]
    if (isinstance(encoded, list) and len(encoded) == 4 and encoded[0] == "num" and isinstance(encoded[2], list)
            and isinstance(encoded[3], list)):
        dtype = _numeric_dtype(encoded[1])
        shape = tuple(encoded[2])
        if not all(isinstance(s, int) and 0 <= s for s in shape) or _prod(shape) != len(encoded[3]):
            raise ValueError("a numeric attribute whose values do not fill its shape")
        return np.array(encoded[3], dtype=dtype).reshape(shape)
    raise ValueError("an attribute of unknown form")


def _numeric_dtype(text):
    import numpy as np

    dt = np.dtype(text) if isinstance(text, str) and len(text) <= 4 else None
    if dt is None or dt.kind not in _NUMERIC_SIZES or dt.itemsize not in _NUMERIC_SIZES[dt.kind]:
        raise ValueError(f"an unsupported numeric type {text!r}")
    return dt


def _prod(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ===================================================================== the walk
def inspect(f, budget):
    """Check every link and object of the open h5py file ``f`` without reading any data.

    Returns ``{path: (shape, dtype descriptor, declared bytes)}`` of every dataset; raises
    :class:`Refusal` naming the object and the fault (see the module docstring), including when
    the datasets declare more than ``budget`` bytes in all.
    """
    import h5py
    from h5py import h5d, h5l, h5o

    datasets, seen, count = {}, set(), [0]

    def walk(group, prefix, depth):
        n = group.id.get_num_objs()
        count[0] += n
        if count[0] > MAX_OBJECTS:
            raise Refusal(f"the file has more than {MAX_OBJECTS} objects.")
        for name in group:
            path = f"{prefix}/{name}"
            _check_name(name, path)
            raw = name.encode("utf-8", "surrogateescape")
            kind = group.id.links.get_info(raw).type
            if kind != h5l.TYPE_HARD:
                what = {h5l.TYPE_SOFT: "soft", h5l.TYPE_EXTERNAL: "external"}.get(kind, "user-defined")
                raise Refusal(f"{path!r} is a {what} link; a fit file has only its own groups and datasets.")
            info = h5o.get_info(group.id, raw)
            if info.rc != 1 or info.addr in seen:
                raise Refusal(f"{path!r} is an object linked more than once.")
            seen.add(info.addr)
            if info.num_attrs > MAX_ATTRIBUTES:
                raise Refusal(f"{path!r} has {info.num_attrs} attributes (at most {MAX_ATTRIBUTES}).")
            if info.type == h5o.TYPE_GROUP:
                if depth >= 1:
                    raise Refusal(f"{path!r} is a nested group; a fit file has one level of groups.")
                sub = group[name]
                _check_attributes(sub, path)
                walk(sub, path, depth + 1)
            elif info.type == h5o.TYPE_DATASET:
                dset = group[name]
                _check_attributes(dset, path)
                datasets[path] = _check_dataset(dset, path, h5py, h5d)
            else:
                raise Refusal(f"{path!r} is an HDF5 object of type {info.type} (not a group or dataset).")

    _check_attributes(f, "the root group")
    walk(f, "", 0)
    total = sum(d[2] for d in datasets.values())
    if total > budget:
        largest = sorted(datasets.items(), key=lambda kv: -kv[1][2])[:3]
        names = ", ".join(f"{p!r} {tuple(d[0])} {d[1]} ({d[2]:,} bytes)" for p, d in largest)
        raise Refusal(f"its datasets declare {total:,} bytes in all, more than the {budget:,} a fit file of its "
                      f"size may hold; the largest: {names}.")
    return datasets


def _check_name(name, path):
    if not name or len(name) > MAX_NAME or not name.isprintable() or name in (".", ".."):
        raise Refusal(f"the object name {path[:80]!r} is empty, too long or not printable.")


def _check_attributes(obj, where):
    import h5py

    for name in obj.attrs:
        if not name or len(name) > MAX_NAME or not name.isprintable():
            raise Refusal(f"an attribute of {where} has an empty, too long or unprintable name.")
        aid = obj.attrs.get_id(name)
        label = f"the attribute {name!r} of {where}"
        space = aid.get_space()
        if space.get_simple_extent_type() not in (h5py.h5s.SIMPLE, h5py.h5s.SCALAR):
            raise Refusal(f"{label} has no data (a null dataspace).")
        shape = space.shape or ()
        if len(shape) > MAX_RANK:
            raise Refusal(f"{label} has {len(shape)} dimensions.")
        dtype = aid.dtype
        if name in REFERENCE_ATTRIBUTES:
            if not _is_reference_type(dtype, h5py):
                raise Refusal(f"{label} is not a list of dimension references.")
            size = _prod(shape) * max(dtype.itemsize, 1)
        elif h5py.check_string_dtype(dtype) is not None:
            size = _prod(shape) * (VLEN_BYTES if h5py.check_string_dtype(dtype).length is None else dtype.itemsize)
        elif dtype.kind in _NUMERIC_SIZES and dtype.itemsize in _NUMERIC_SIZES[dtype.kind]:
            size = _prod(shape) * dtype.itemsize
        else:
            raise Refusal(f"{label} has the unsupported type {dtype}.")
        if size > MAX_ATTRIBUTE_BYTES:
            raise Refusal(f"{label} declares {size:,} bytes (at most {MAX_ATTRIBUTE_BYTES:,}).")


def _is_reference_type(dtype, h5py):
    if h5py.check_vlen_dtype(dtype) is not None:
        return h5py.check_ref_dtype(h5py.check_vlen_dtype(dtype)) is not None
    if dtype.names:
        return all(h5py.check_ref_dtype(dtype[n]) is not None or dtype[n].kind in "iu" for n in dtype.names)
    return False


def _check_dataset(dset, path, h5py, h5d):
    plist = dset.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5d.VIRTUAL or dset.is_virtual:
        raise Refusal(f"{path!r} is a virtual dataset (its data would come from other files or datasets).")
    if layout not in (h5d.COMPACT, h5d.CONTIGUOUS, h5d.CHUNKED):
        raise Refusal(f"{path!r} has an unknown storage layout ({layout}).")
    if plist.get_external_count() or dset.external:
        raise Refusal(f"{path!r} keeps its data in external file(s); a fit file holds all its data itself.")
    allowed = {h5py.h5z.FILTER_DEFLATE: "deflate", h5py.h5z.FILTER_SHUFFLE: "shuffle",
               h5py.h5z.FILTER_FLETCHER32: "fletcher32"}
    for i in range(plist.get_nfilters()):
        code = plist.get_filter(i)[0]
        if code not in allowed:
            raise Refusal(f"{path!r} uses the HDF5 filter {code}; only deflate, shuffle and fletcher32 are read.")
    space = dset.id.get_space()
    if space.get_simple_extent_type() not in (h5py.h5s.SIMPLE, h5py.h5s.SCALAR):
        raise Refusal(f"{path!r} has no data (a null dataspace).")
    shape = tuple(space.shape or ())
    if len(shape) > MAX_RANK:
        raise Refusal(f"{path!r} has {len(shape)} dimensions (at most {MAX_RANK}).")
    dtype = dset.dtype
    info = h5py.check_string_dtype(dtype)
    if info is not None and info.length is None:
        descr, itemsize = "str", VLEN_BYTES
    elif info is None and dtype.kind in _NUMERIC_SIZES and dtype.itemsize in _NUMERIC_SIZES[dtype.kind] \
            and not dtype.metadata:
        descr, itemsize = dtype.str, dtype.itemsize
    else:
        raise Refusal(f"{path!r} has the type {dtype}; a fit file holds numbers and variable-length text.")
    if layout == h5d.CHUNKED:
        chunk = plist.get_chunk()
        if len(chunk) != len(shape) or _prod(chunk) * itemsize > MAX_CHUNK_BYTES:
            raise Refusal(f"{path!r} declares chunks of {tuple(chunk)} elements (at most "
                          f"{MAX_CHUNK_BYTES:,} bytes each).")
    elif plist.get_nfilters():
        raise Refusal(f"{path!r} has filters but is not chunked.")
    return list(shape), descr, _prod(shape) * itemsize


# ===================================================================== describing and reading
def describe(f, read_groups, datasets):
    """The structure message: root attributes and, per group, attributes and variables.

    ``f`` is an open :class:`h5netcdf.File`; ``datasets`` the result of :func:`inspect`. The
    groups in ``read_groups`` are described fully (dims and attributes of every variable);
    the others by their variables' shapes and dtypes only.
    """
    out = {"attrs": _attributes(f, "the root group"), "groups": {}, "root_variables": sorted(f.variables)}
    for gname, group in f.groups.items():
        full = gname in read_groups
        desc = {"attrs": _attributes(group, f"the group {gname!r}") if full else {}, "variables": {}}
        for vname, var in group.variables.items():
            key = f"/{gname}/{vname}"
            shape, descr, nbytes = datasets[key if key in datasets else f"/{gname}/_nc4_non_coord_{vname}"]
            item = {"shape": shape, "dtype": descr, "bytes": nbytes}
            if full:
                dims = list(var.dimensions)
                if len(dims) != len(shape) or not all(isinstance(d, str) for d in dims):
                    raise Refusal(f"the variable {vname!r} of group {gname!r} has dimensions that do not match its "
                                  "shape.")
                item.update(dims=dims, attrs=_attributes(var, f"the variable {vname!r} of group {gname!r}"))
            desc["variables"][vname] = item
        out["groups"][gname] = desc
    return out


def _attributes(obj, where):
    return {name: encode_attribute(obj.attrs[name], f"the attribute {name!r} of {where}") for name in obj.attrs}


def read_arrays(f, wanted, budget):
    """Read the variables ``wanted`` (``[[group, name], ...]``) of the open h5py file ``f``
    (checked by :func:`inspect`).

    Returns ``(index, arrays)``: per variable its dtype and shape, and for text its values;
    ``arrays`` the numeric arrays, in the index's order. Text may take at most ``budget``
    characters in all.
    """
    import numpy as np

    index, arrays, chars = [], [], 0
    for gname, vname in wanted:
        if not (isinstance(gname, str) and isinstance(vname, str)):
            raise Refusal("the parent asked for a variable by a name that is not text.")
        group = f[gname]
        dset = group[vname] if vname in group else group["_nc4_non_coord_" + vname]  # as h5netcdf names it
        data = dset[()]
        if isinstance(data, (bytes, str)):  # a scalar text dataset
            data = np.array([data], dtype=object).reshape(())
        data = np.asarray(data)
        entry = {"group": gname, "name": vname, "shape": list(data.shape)}
        if data.dtype.kind == "O":
            try:
                values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in data.ravel().tolist()]
            except UnicodeDecodeError:
                raise Refusal(f"the text variable {vname!r} of group {gname!r} is not UTF-8.") from None
            if not all(isinstance(v, str) for v in values):
                raise Refusal(f"the text variable {vname!r} of group {gname!r} holds values that are not text.")
            chars += sum(len(v) for v in values)
            if chars > budget:
                raise Refusal(f"the text variables hold more than {budget:,} characters.")
            entry.update(dtype="str", values=values)
        else:
            data = np.ascontiguousarray(data).reshape(data.shape)  # (ascontiguousarray makes 0-d arrays 1-d)
            entry.update(dtype=data.dtype.str, nbytes=data.nbytes)
            arrays.append(data)
        index.append(entry)
    return index, arrays


def content_digest(structure, read_groups, values):
    """SHA-256 (hex) of everything a load reads: root attributes (but the checksum itself), and
    for each group of ``read_groups`` its attributes and every variable's name, dims, dtype,
    shape, attributes and values.

    ``structure`` is :func:`describe`'s message, ``values`` maps ``(group, name)`` to a numpy
    array (numbers hashed as little-endian bytes, text as JSON).
    """
    import numpy as np

    h = hashlib.sha256()

    def add_json(obj):
        data = json.dumps(obj, sort_keys=True, allow_nan=True, separators=(",", ":")).encode()
        h.update(struct.pack("<Q", len(data)))
        h.update(data)

    add_json({k: v for k, v in structure["attrs"].items() if k != CHECKSUM_ATTRIBUTE})
    for gname in sorted(read_groups):
        group = structure["groups"].get(gname)
        if group is None:
            add_json(None)
            continue
        add_json([gname, group["attrs"]])
        for vname in sorted(group["variables"]):
            meta = group["variables"][vname]
            arr = values[(gname, vname)]
            add_json([vname, meta.get("dims"), meta["dtype"], list(arr.shape), meta.get("attrs")])
            if arr.dtype.kind == "O":
                add_json(arr.ravel().tolist())
            else:
                little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
                h.update(struct.pack("<Q", little.nbytes))
                h.update(np.ascontiguousarray(little).data)
    return h.hexdigest()


def collect(h5file, read_groups, budget=float("inf")):
    """In-process: ``(structure, values)`` of an open h5py file (a file vbsvm just wrote), read
    as the child reads it; for :func:`content_digest` at save time."""
    import h5netcdf
    import numpy as np

    datasets = inspect(h5file, budget)
    with h5netcdf.File(h5file, "r", phony_dims="access") as f:
        structure = describe(f, read_groups, datasets)
    wanted = [[g, v] for g in sorted(read_groups) if g in structure["groups"]
              for v in sorted(structure["groups"][g]["variables"])]
    index, arrays = read_arrays(h5file, wanted, budget)
    values, numeric = {}, iter(arrays)
    for entry in index:
        key = (entry["group"], entry["name"])
        if entry["dtype"] == "str":
            arr = np.empty(len(entry["values"]), dtype=object)
            arr[:] = entry["values"]
            values[key] = arr.reshape(entry["shape"])
        else:
            values[key] = next(numeric)
    return structure, values


# ===================================================================== the child
def _limit_resources(memory, seconds):
    try:
        import resource
    except ImportError:  # not on this platform: the parent's time limit still holds
        return
    with open("/proc/self/statm") if os.path.exists("/proc/self/statm") else io.StringIO("0") as fh:
        pages = int(fh.read().split()[0])
    current = pages * os.sysconf("SC_PAGE_SIZE") if pages else 0
    for which, value in ((resource.RLIMIT_AS, current + memory), (resource.RLIMIT_CPU, seconds),
                         (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass


def _peak_rss():
    """This process's peak resident memory in bytes (Linux: ``VmHWM``, which, unlike
    ``ru_maxrss``, does not carry the parent's size over ``exec``); None where unknown."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def main(argv):
    """The child: ``argv = [fd or path, limits JSON]`` (see the module docstring)."""
    import h5netcdf  # every import before the limits: nothing is loaded later
    import h5netcdf.core
    import h5py
    import numpy  # noqa: F401

    start = time.monotonic()
    limits = json.loads(argv[1])
    out = sys.stdout.buffer
    commands = sys.stdin.buffer
    _limit_resources(limits["memory"], limits["cpu_seconds"])
    try:
        source = argv[0]
        handle = io.FileIO(int(source) if source.isdigit() else source, "rb", closefd=not source.isdigit())
        with handle, h5py.File(handle, "r", locking=False) as hf:
            datasets = inspect(hf, limits["budget"])
            with h5netcdf.File(hf, "r", phony_dims="access") as f:
                structure = describe(f, set(limits["read_groups"]), datasets)
                write_message(out, {"structure": structure})
                line = commands.readline(1 << 24)
                wanted = json.loads(line) if line else None
                if wanted is None:  # the parent refused the structure
                    write_message(out, {"peak_rss": _peak_rss(), "seconds": time.monotonic() - start})
                    return 0
            index, arrays = read_arrays(hf, wanted, limits["budget"])
        write_message(out, {"index": index})
        for arr in arrays:
            out.write(memoryview(arr.reshape(-1)).cast("B"))
        write_message(out, {"peak_rss": _peak_rss(), "seconds": time.monotonic() - start})
        return 0
    except Refusal as exc:
        error = str(exc)
    except MemoryError:
        error = "reading it needs more memory than the reader's bound"
    except Exception as exc:  # noqa: BLE001 - libhdf5 and h5netcdf raise many types on damaged files
        text = " ".join(str(exc).split())[:300]
        error = f"it cannot be read as netCDF/HDF5, it is truncated or corrupted ({type(exc).__name__}: {text})"
    write_message(out, {"error": error, "peak_rss": _peak_rss(), "seconds": time.monotonic() - start})
    return 1


if __name__ == "__main__":
    for _entry in json.loads(sys.argv[3]) if len(sys.argv) > 3 else []:
        sys.path.insert(0, _entry)  # where the parent found numpy, h5py and h5netcdf
    sys.exit(main(sys.argv[1:3]))
