#!/usr/bin/env python3
"""A reference decoder of PULSESync patches (format 3), written from src/sync/FORMAT.md alone.

It shares no code with pulse: it reads a patch, applies it to a base state (a dict of name ->
(dtype, shape, bytes)) and returns the target state and metadata, refusing (RefError) anything the
specification refuses. Needs numpy; zstandard for zstd patches, lz4 for lz4 patches, xxhash for
the checksum and the digests (without xxhash, digests are not checked: `check_digests=False`;
the tests require it). Slow (pure Python range decoding): meant for small states.

    pulse_ref_decode.py BASE.safetensors PATCH [--history FILE --history-digest HEX] [-o OUT.safetensors]
"""
import argparse
import json
import struct
import sys

import numpy as np

try:
    import xxhash
except ImportError:  # digests unchecked (the tests require it)
    xxhash = None


class RefError(Exception):
    pass


def require(cond, what):
    if not cond:
        raise RefError(what)


# ---- section 1: conventions ----

def read_varint(buf, pos):
    v = 0
    for i in range(10):
        require(pos < len(buf), "varint runs past its stream")
        b = buf[pos]
        pos += 1
        require(i < 9 or b <= 1, "varint beyond 64 bits")
        v |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return v, pos
    raise RefError("varint of more than 10 bytes")


def unzigzag(u):
    return (u >> 1) ^ -(u & 1)


def xxh3(data):
    return xxhash.xxh3_128_digest(bytes(data))  # canonical: big-endian


def xxh3_int(data, seed):
    return xxhash.xxh3_128_intdigest(bytes(data), seed=seed)


# ---- section 2: element types ----

BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
# dtype: (w, m, e, sign-magnitude)
SPARSE = {"BF16": (2, 7, 8, True), "F16": (2, 10, 5, True), "F32": (4, 23, 8, True),
          "F8_E5M2": (1, 2, 5, True), "F8_E5M2FNUZ": (1, 2, 5, True),
          "F8_E4M3": (1, 3, 4, True), "F8_E4M3FNUZ": (1, 3, 4, True), "F8_E8M0": (1, 0, 8, False)}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
HEADER_BYTES = 136  # FORMAT.md: the fixed header before the entry table


class Fmt:
    def __init__(self, dtype):
        self.w, self.m, self.e, self.signed = SPARSE[dtype]
        self.S = 1 << (8 * self.w - 1)
        self.M = (1 << (8 * self.w)) - 1
        self.K = 1 << self.e
        self.maxvarint = {1: 2, 2: 3, 4: 5}[self.w]

    def key(self, x):
        if not self.signed:
            return x
        return (~x & self.M) if x & self.S else x | self.S

    def from_key(self, k):
        if not self.signed:
            return k
        return k ^ self.S if k & self.S else ~k & self.M

    def classes(self, old):  # numpy array of bits -> classes
        return (old.astype(np.uint64) >> np.uint64(self.m)) & np.uint64(self.K - 1)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_bytes(dtype, shape):
    require(dtype in BITS, f"unknown dtype {dtype}")
    bits = numel(shape) * BITS[dtype]
    require(bits % 8 == 0, "tensor does not fill whole bytes")
    return bits // 8


# ---- section 3: digests ----

def tensor_digest(data):
    total = 0
    for b in range(0, (len(data) + 127) // 128):
        total += xxh3_int(data[128 * b:128 * b + 128], b)
    return (total % (1 << 128)).to_bytes(16, "big")


def layout_stream(state, with_digests, metadata):
    out = bytearray()
    for name in sorted(state, key=lambda s: s.encode()):
        dtype, shape, data = state[name]
        out += name.encode() + b"\0" + dtype.encode() + b"\0" + struct.pack("<Q", len(shape))
        out += b"".join(struct.pack("<q", d) for d in shape)
        if with_digests:
            out += tensor_digest(data)
    if metadata:
        out += b"\xff" + struct.pack("<Q", len(metadata))
        for k in sorted(metadata, key=lambda s: s.encode()):
            for s in (k.encode(), metadata[k].encode()):
                out += struct.pack("<Q", len(s)) + s
    return bytes(out)


def layout_digest(state):
    return xxh3(layout_stream(state, False, {}))


def state_digest(state, metadata):
    return xxh3(layout_stream(state, True, metadata))


# ---- sections 4-6: header and tables ----

class Cursor:
    def __init__(self, buf, pos, end):
        self.buf, self.pos, self.end = buf, pos, end

    def take(self, n):
        require(n <= self.end - self.pos, "table truncated")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self):
        return self.take(1)[0]

    def varint(self):
        v, self.pos = read_varint(self.buf[:self.end], self.pos)
        return v

    def string(self):
        return bytes(self.take(self.varint())).decode("utf-8", "surrogateescape")


def parse(patch, public_key=None, check_digests=True):
    require(len(patch) >= 12 and patch[:8] == b"PULSEPCH", "bad magic")
    version = struct.unpack_from("<H", patch, 8)[0]
    require(version not in (1, 2), f"format {version} is no longer read")
    require(version == 3, f"format {version} unknown")
    require(len(patch) >= HEADER_BYTES + 16, "truncated")
    flags, values, indices, compressor, reserved = struct.unpack_from("<HBBBB", patch, 10)
    require(flags & ~7 == 0, "unknown flags")
    require(values != 2 and indices != 2, "coding id 2 is no longer read")
    require(values in (0, 1, 3, 4) and indices in (0, 1, 3, 4) and compressor <= 2 and reserved == 0,
            "unknown coding or compressor")
    require(values == indices if (values >= 3 or indices >= 3) else True, "expclass for one half only")
    h = {"signed": bool(flags & 1), "layout": bool(flags & 2), "metadata": bool(flags & 4), "values": values,
         "indices": indices, "compressor": compressor}
    h["base_version"], h["target_version"] = struct.unpack_from("<QQ", patch, 16)
    h["base_layout"], h["base_state"], h["target_state"] = patch[32:48], patch[48:64], patch[64:80]
    streams = struct.unpack_from("<6Q", patch, 80)
    h["index"], h["value"], h["whole"] = (streams[0], streams[1]), (streams[2], streams[3]), (streams[4], streams[5])
    T = struct.unpack_from("<Q", patch, 128)[0]
    trailer = 16 + (64 if h["signed"] else 0)
    require(HEADER_BYTES + T + streams[0] + streams[2] + streams[4] + trailer == len(patch), "file size")
    end = len(patch) - trailer
    if xxhash is not None:
        require(xxh3(patch[:end]) == bytes(patch[end:end + 16]), "checksum mismatch")
    require(public_key is None or h["signed"], "unsigned patch with a public key")  # signatures: not checked here

    t = Cursor(patch, HEADER_BYTES, HEADER_BYTES + T)
    if values == 4:
        h["history"] = bytes(t.take(16))
        require(not h["layout"], "expclass-history with a layout change")
    removed, added, metadata = [], [], None
    if h["layout"]:
        removed = [t.string() for _ in range(t.varint())]
        for _ in range(t.varint()):
            name, dtype = t.string(), t.string()
            shape = [t.varint() for _ in range(t.varint())]
            require(all(d < 2 ** 63 for d in shape), "dimension out of range")
            added.append((name, dtype, shape))
        require(removed or added, "layout change that changes nothing")
    if h["metadata"]:
        metadata = {}
        for _ in range(t.varint()):
            k = t.string()
            require(k not in metadata, "metadata key twice")
            metadata[k] = t.string()
    summary = []
    for _ in range(t.varint()):
        summary.append((t.string(), t.varint(), t.varint(), t.varint(), t.varint()))
    require(all(summary[i][0].encode() < summary[i + 1][0].encode() for i in range(len(summary) - 1)),
            "dtype summary not in order")
    entries = []
    for _ in range(t.varint()):
        kind = t.u8()
        require(kind <= 2, "unknown entry kind")
        count = width = 0
        if kind == 0:
            count = t.varint()
            if indices == 0:
                width = t.u8()
                require(width in (1, 2, 4, 8), "bad gap width")
        entries.append((kind, count, width))
    total = sum(e[1] for e in entries)
    require(sum(s[3] for s in summary) == total, "dtype summary does not add up")
    # Part table tokens: (size, count) a segment inside its entry; (0, k) k segments that end
    # their entries, each with the rest of its entry's count (its size comes from the layout).
    sparse_counts = [e[1] for e in entries if e[0] == 0]
    entry, entry_changes = 0, 0
    parts = []
    for _ in range(t.varint()):
        ntok = t.varint()
        require(ntok >= 1, "part without segments")
        segs = []  # (elements or None for the rest of the entry, count)
        for _ in range(ntok):
            size, n = t.varint(), t.varint()
            require(entry < len(sparse_counts), "segments beyond the sparse entries")
            if size > 0:
                require(n <= size and n <= sparse_counts[entry] - entry_changes, "bad segment")
                segs.append((size, n))
                entry_changes += n
                continue
            require(1 <= n <= len(sparse_counts) - entry, "ends more entries than there are")
            for _ in range(n):
                segs.append((None, sparse_counts[entry] - entry_changes))
                entry, entry_changes = entry + 1, 0
        sizes = [t.varint() for _ in range(4)]  # index coded, raw, value coded, raw
        parts.append((segs, sizes))
    require(entry == len(sparse_counts), "parts do not end every sparse entry")
    require(t.pos == t.end, "table has trailing bytes")
    for k, s in ((0, "index"), (2, "value")):
        require(sum(p[1][k] for p in parts) == h[s][0] and sum(p[1][k + 1] for p in parts) == h[s][1],
                "part sizes do not add up")
    require(sum(c for p in parts for _, c in p[0]) == total, "parts do not add up to the entries")
    h["streams_at"] = HEADER_BYTES + T
    return h, removed, added, metadata, summary, entries, parts


# ---- section 7: streams ----

def decompress(compressor, coded, raw_size):
    coded = bytes(coded)
    if compressor == 0 or raw_size == 0:
        require(len(coded) == raw_size, "stream size")
        return coded
    if compressor == 1:
        import zstandard
        d = zstandard.ZstdDecompressor().decompressobj()
        try:
            out = d.decompress(coded)
        except zstandard.ZstdError as e:
            raise RefError(f"corrupt zstd stream: {e}")
        require(d.eof and not d.unused_data, "zstd stream is not exactly one frame")
    else:
        import lz4.block
        try:
            out = lz4.block.decompress(coded, uncompressed_size=raw_size)
        except Exception as e:  # lz4 raises LZ4BlockError
            raise RefError(f"corrupt lz4 stream: {e}")
    require(len(out) == raw_size, "stream decodes to another size")
    return out


# ---- section 8: expclass ----

class BitModel:
    __slots__ = ("p0", "seen")

    def __init__(self):
        self.p0, self.seen = 16384, 0

    def adapt(self, bit):
        s = 2 + self.seen // 8
        self.p0 = self.p0 - (self.p0 >> s) if bit else self.p0 + ((32768 - self.p0) >> s)
        if self.seen < 40:
            self.seen += 1


class IntegerModel:
    def __init__(self):
        self.length = [BitModel() for _ in range(40)]
        self.top = [BitModel() for _ in range(40)]


class RangeDecoder:
    def __init__(self, stream):
        self.s, self.pos = stream, 0
        require(self.next_byte() == 0, "range code does not start with 0")
        self.code = 0
        for _ in range(4):
            self.code = ((self.code << 8) | self.next_byte()) & 0xFFFFFFFF
        self.range = 0xFFFFFFFF

    def next_byte(self):
        require(self.pos < len(self.s), "stream ends inside its code")
        self.pos += 1
        return self.s[self.pos - 1]

    def normalize(self):
        while self.range < (1 << 24):
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self.next_byte()) & 0xFFFFFFFF

    def bit(self, model):
        bound = (self.range >> 15) * model.p0
        if self.code < bound:
            b, self.range = 0, bound
        else:
            b, self.code, self.range = 1, self.code - bound, self.range - bound
        model.adapt(b)
        self.normalize()
        return b

    def even(self, t):
        value = 0
        while t > 0:
            take = min(t, 8)
            t -= take
            self.range >>= take
            digit = min(self.code // self.range, (1 << take) - 1)
            self.code -= digit * self.range
            value = (value << take) | digit
            self.normalize()
        return value

    def integer(self, model, mx):
        maxlen = (mx + 1).bit_length() - 1
        L = 0
        while self.bit(model.length[min(L, 39)]):
            L += 1
            require(L <= maxlen, "value out of range")
        x = 1
        if L > 0:
            x = 2 | self.bit(model.top[min(L, 39)])
            x = (x << (L - 1)) | self.even(L - 1)
        require(x - 1 <= mx, "value out of range")
        return x - 1


class ClassModel:
    def __init__(self):
        self.any = [BitModel(), BitModel()]
        self.gap, self.step = IntegerModel(), IntegerModel()
        self.sign = [BitModel() for _ in range(13)]


def ctx(m):
    return m.bit_length()


def bucket(age):
    return 0 if age <= 1 else 1 if age == 2 else 2 if age <= 4 else 3 if age <= 8 else 4 if age <= 16 else 5


class ExpclassPart:
    def __init__(self, index_raw, value_raw, changes, history_coding):
        self.history_coding = history_coding
        self.classes = [ClassModel() for _ in range(256)]
        self.counts = [IntegerModel() for _ in range(65)]
        self.I = self.V = None
        if changes == 0:
            require(len(index_raw) == 0 and len(value_raw) == 0, "streams of a part without changes")
        else:
            self.I, self.V = RangeDecoder(index_raw), RangeDecoder(value_raw)

    def segment(self, f, old, count, history):
        """old: numpy array of the segment's n old bits; returns (indices, new bits)."""
        n = len(old)
        require(count <= n, "more changes than elements")
        I, V = self.I, self.V
        coded = prev = 0
        found = []  # (element, d or |d|, class)
        klass = f.classes(old)
        for c in range(f.K):
            if coded == count:
                break
            C = self.classes[c]
            m = self.I.integer(self.counts[ctx(prev)], count - coded - 1) + 1 if I.bit(C.any[1 if prev else 0]) else 0
            prev = m
            coded += m
            members = None
            r = 0
            for _ in range(m):
                require(r < n, "index out of range")
                rank = r + I.integer(C.gap, n - 1 - r)
                r = rank + 1
                negative = V.even(1) if not self.history_coding else 0
                step = V.integer(C.step, f.M - 1) + 1
                if members is None:
                    members = np.nonzero(klass == c)[0]
                require(rank < len(members), "index out of range")
                found.append((int(members[rank]), -step if negative else step, c))
        require(coded == count, "fewer changes than the entry declares")
        found.sort()
        idx, new = [], []
        for i, d, c in found:
            if self.history_coding:
                h = int(history[i])
                x = 0 if h == 0 else 1 + (6 if h & 0x80 else 0) + bucket(h & 127)
                lowered = V.even(1) if x == 0 else V.bit(self.classes[c].sign[x])
                d = -d if lowered else d
            k = f.key(int(old[i])) + d
            require(0 <= k <= f.M, "value out of range")
            idx.append(i)
            new.append(f.from_key(k))
        return idx, new

    def check_consumed(self):
        if self.I is not None:
            require(self.I.pos == len(self.I.s) and self.V.pos == len(self.V.s), "streams hold unused bytes")


class GapPart:
    def __init__(self, index_raw, value_raw, values, indices):
        self.ix, self.vx, self.values, self.indices = index_raw, value_raw, values, indices
        self.ip = self.vp = 0

    def segment(self, f, old, count, width):
        n, idx = len(old), []
        nxt = 0
        for _ in range(count):
            if self.indices == 1:
                gap, self.ip = read_varint(self.ix, self.ip)
            else:
                require(len(self.ix) - self.ip >= width, "index stream truncated")
                gap = int.from_bytes(self.ix[self.ip:self.ip + width], "little")
                self.ip += width
            require(nxt < n and gap < n - nxt, "index out of range")
            idx.append(nxt + gap)
            nxt = nxt + gap + 1
        new = []
        if self.values == 0:
            require(len(self.vx) - self.vp >= count * f.w, "value stream short")
            planes = self.vx[self.vp:self.vp + count * f.w]
            self.vp += count * f.w
            new = [sum(planes[p * count + k] << (8 * p) for p in range(f.w)) for k in range(count)]
        else:
            for i in idx:
                u, self.vp = read_varint(self.vx, self.vp)
                d = unzigzag(u)
                require(-f.M <= d <= f.M, "value out of range")
                k = f.key(int(old[i])) + d
                require(0 <= k <= f.M, "value out of range")
                new.append(f.from_key(k))
        return idx, new

    def check_consumed(self):
        require(self.ip == len(self.ix) and self.vp == len(self.vx), "streams hold unused bytes")


# ---- section 10: receiving ----

def decode(patch, base, metadata, history=None, check_digests=True):
    """Applies patch to base ({name: (dtype, shape, bytes)}) with its metadata; history: (digest,
    {name: bytes}) for expclass-history. Returns (target state, target metadata)."""
    patch = memoryview(bytes(patch))
    check_digests = check_digests and xxhash is not None
    h, removed, added, new_metadata, summary, entries, parts = parse(patch)
    if h["values"] == 4:
        require(history is not None and history[0] == h["history"], "not the patch's change history")
    if check_digests:
        require(layout_digest(base) == h["base_layout"], "not the base layout")
        require(state_digest(base, metadata) == h["base_state"], "not the base state")
    target = {name: (base[name][0], base[name][1], None) for name in base}
    for name in removed:
        require(name in target, "removes a tensor the receiver lacks")
        del target[name]
    added_names = set()
    for name, dtype, shape in added:
        require(name not in target, "adds a tensor twice or over a kept one")
        target[name] = (dtype, shape, None)
        added_names.add(name)
    names = sorted(target, key=lambda s: s.encode())
    require(len(names) == len(entries), "entries do not match the target layout")

    # The segments against the entries (before any decompression), and the summary.
    plan = []  # (entry name, part, begin, elements, count)
    seg_list = [(p, s) for p, (segs, _) in enumerate(parts) for s in segs]
    si = 0
    want = {}
    value_exact = [0] * len(parts)
    value_max = [0] * len(parts)
    index_exact = [0] * len(parts)
    whole_bytes = 0
    for name, (kind, count, width) in zip(names, entries):
        dtype, shape, _ = target[name]
        nbytes = tensor_bytes(dtype, shape)
        s = want.setdefault(dtype, [0, 0, 0, 0])
        s[0] += 1
        s[1] += numel(shape)
        if name in added_names:
            require(kind == 2, "added tensor not whole")
        if kind == 2:
            whole_bytes += nbytes
            s[3] += nbytes
        if kind != 0:
            continue
        require(dtype in SPARSE, "sparse entry of a dtype that is not sparse-coded")
        f = Fmt(dtype)
        n = numel(shape)
        require(count <= n, "more changes than elements")
        s[2] += count
        covered = changes = 0
        ended = False
        while not ended:  # the entry's segments, up to the one that ends it
            require(si < len(seg_list), "parts end inside a tensor")
            p, (el, cnt) = seg_list[si]
            si += 1
            ended = el is None
            if ended:
                el = n - covered
            require((ended or el < n - covered) and cnt <= el and (covered * f.w) % 128 == 0,
                    "segment crosses a tensor or a block")
            if el > 0:
                plan.append((name, p, covered, el, cnt, width))
            value_exact[p] += cnt * f.w
            value_max[p] += cnt * f.maxvarint
            index_exact[p] += cnt * width
            covered += el
            changes += cnt
        require(changes == count, "segments do not add up to the entry")
    require(si == len(seg_list), "segments beyond the sparse entries")
    require([(d, *want[d]) for d in sorted(want, key=lambda s: s.encode())] == summary, "dtype summary")
    require(h["whole"][1] == whole_bytes, "whole stream size")
    for p, (segs, (ic, ir, vc, vr)) in enumerate(parts):
        c = sum(x for _, x in segs)
        if h["values"] >= 3:
            bound = 16 + 256 * c + 704 * len(segs)
            require((c == 0) == (ir == 0) and (c == 0) == (vr == 0) and ir <= bound and vr <= bound, "part sizes")
        else:
            if h["indices"] == 0:
                require(ir == index_exact[p], "index stream size")
            else:
                require(c <= ir <= 10 * c, "index stream size")
            if h["values"] == 0:
                require(vr == value_exact[p], "value stream size")
            else:
                require(c <= vr <= value_max[p], "value stream size")

    # Decompress and decode.
    at = h["streams_at"]
    index_at, value_at = at, at + h["index"][0]
    whole_at = value_at + h["value"][0]
    decoders = []
    for segs, (ic, ir, vc, vr) in parts:
        ix = decompress(h["compressor"], patch[index_at:index_at + ic], ir)
        vx = decompress(h["compressor"], patch[value_at:value_at + vc], vr)
        index_at += ic
        value_at += vc
        if h["values"] >= 3:
            decoders.append(ExpclassPart(ix, vx, sum(x for _, x in segs), h["values"] == 4))
        else:
            decoders.append(GapPart(ix, vx, h["values"], h["indices"]))
    whole = decompress(h["compressor"], patch[whole_at:whole_at + h["whole"][0]], h["whole"][1])

    out = {}
    for name in names:
        dtype, shape, _ = target[name]
        out[name] = (dtype, shape, bytes(base[name][2]) if name in base and name not in added_names else None)
    pos = 0
    for name, (kind, count, width) in zip(names, entries):
        if kind == 2:
            n = tensor_bytes(*target[name][:2])
            out[name] = (out[name][0], out[name][1], bytes(whole[pos:pos + n]))
            pos += n
    arrays = {}
    for name, p, begin, el, cnt, width in plan:
        dtype = target[name][0]
        f = Fmt(dtype)
        if name not in arrays:
            arrays[name] = np.frombuffer(base[name][2], dtype=UINT[f.w]).copy()
        old = np.frombuffer(base[name][2], dtype=UINT[f.w])[begin:begin + el]
        if cnt == 0:
            continue
        if h["values"] >= 3:
            hist = history[1][name][begin:begin + el] if h["values"] == 4 else None
            require(h["values"] != 4 or hist is not None, "history does not track the tensor")
            idx, new = decoders[p].segment(f, old, cnt, hist)
        else:
            idx, new = decoders[p].segment(f, old, cnt, width)
        arrays[name][np.array(idx, dtype=np.int64) + begin] = np.array(new, dtype=np.uint64).astype(UINT[f.w])
    for d in decoders:
        d.check_consumed()
    for name, a in arrays.items():
        out[name] = (out[name][0], out[name][1], a.tobytes())
    target_metadata = new_metadata if h["metadata"] else dict(metadata)
    if check_digests:
        require(state_digest(out, target_metadata) == h["target_state"], "target state digest mismatch")
    return out, target_metadata


# ---- safetensors, for the command line and the tests ----

def read_safetensors(path):
    with open(path, "rb") as fh:
        data = fh.read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {}) or {}
    state = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        state[name] = (t["dtype"], list(t["shape"]), data[8 + n + a:8 + n + b])
    return state, metadata


def write_safetensors(path, state, metadata):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in state.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_history(path, digest_hex, base):
    """history.bin: the tracked tensors' bytes (one per element) in name order."""
    with open(path, "rb") as fh:
        data = fh.read()
    out, pos = {}, 0
    for name in sorted((n for n in base if base[n][0] in SPARSE), key=lambda s: s.encode()):
        n = numel(base[name][1])
        out[name] = np.frombuffer(data[pos:pos + n], dtype=np.uint8)
        pos += n
    require(pos == len(data), "history file does not fit the base layout")
    return bytes.fromhex(digest_hex), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("patch")
    ap.add_argument("--history")
    ap.add_argument("--history-digest")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    base, metadata = read_safetensors(a.base)
    history = read_history(a.history, a.history_digest, base) if a.history else None
    with open(a.patch, "rb") as fh:
        patch = fh.read()
    try:
        target, target_metadata = decode(patch, base, metadata, history)
    except RefError as e:
        print(f"pulse_ref_decode: refused: {e}", file=sys.stderr)
        return 1
    if a.out:
        write_safetensors(a.out, target, target_metadata)
    print(f"decoded {len(target)} tensors" + ("" if xxhash else " (digests not checked: no xxhash)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
