#!/usr/bin/env python3
"""pulse's structure from its #include lines: files per layer, the largest files and which layers
each layer includes (a layer is a folder of src/, or kernels/). Run from the repository root:
    python3 tests/layering/include_graph.py [ROOT]"""
import collections
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
quoted = re.compile(r'#\s*include\s*"([^"]+)"')
system = re.compile(r"#\s*include\s*<(Kokkos\w*|mpi)\.h(pp)?>")


def layer_of(path):
    parts = path.split("/")
    return "kernels" if parts[0] == "kernels" else parts[1]


files_per_layer = collections.Counter()
lines = {}
edges = collections.defaultdict(set)
direct = collections.defaultdict(set)  # layers that include Kokkos or MPI headers themselves
for top in ("src", "kernels"):
    for folder, _, names in os.walk(os.path.join(root, top)):
        for name in names:
            if not name.endswith((".hpp", ".cpp")):
                continue
            path = os.path.relpath(os.path.join(folder, name), root)
            layer = layer_of(path)
            text = open(os.path.join(root, path), encoding="utf-8").read()
            files_per_layer[layer] += 1
            lines[path] = text.count("\n")
            for m in system.finditer(text):
                direct[layer].add("Kokkos" if m.group(1).startswith("Kokkos") else "MPI")
            for m in quoted.finditer(text):
                target = m.group(1).split("/")[0] if "/" in m.group(1) else layer
                if target != layer:
                    edges[layer].add(target)

print("files per layer:", ", ".join(f"{k} {v}" for k, v in sorted(files_per_layer.items())))
print("largest files:")
for path, n in sorted(lines.items(), key=lambda kv: -kv[1])[:10]:
    print(f"  {n:5d} {path}")
print("layer -> layers it includes [Kokkos/MPI headers it includes itself]:")
for layer in sorted(files_per_layer):
    own = " [" + " ".join(sorted(direct[layer])) + "]" if direct[layer] else ""
    print(f"  {layer:8s} -> {' '.join(sorted(edges[layer])) or '-'}{own}")
