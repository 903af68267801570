"""The k best gradient paths, enumerated lazily from the best-path tree.

One provenance viterbi walk (paths.py) gives every element v its best path
value to the output, best(v), and the first edge of that path (the tree).
The j-th best path from v is an edge e = (v → y) followed by the i-th best
path from y; the candidates of v are the pairs (e, i), scored

    c_e − best(y) + kbest(y)[i]        (c_e = best(y) ⊗ lift(w_e) = log|w_e| + best(y)),

and taking one (e, i) offers (e, i + 1) — the recursive enumeration algorithm
of Jiménez & Marzal (1999), the k-best analogue of Viterbi back-pointers. An
offered (e, i + 1) is scored lazily: kbest(y)[i] bounds it from above, so
kbest(y)[i + 1] is computed only when that bound reaches the top of v's heap.
A super-source whose edges go to every input element starts the enumeration.

Only the k best edges of an element are ever taken, and one run of a
consuming node's kmax(k)+paths rule, its incoming values the best(y) lists,
gives them for every element of the node's input, the winners' ids naming y.
Cost model: the viterbi provenance walk, plus one kmax(k)+paths rule run per
(node, input edge) holding an element whose second-best path is asked for —
the nodes along the enumerated paths (on a transformer, the residual stream's
adds and norms), instead of a kmax(k)+paths walk of the whole graph. A node
whose rule has independent rows (layer and RMS norm: RuleEntry::row_length)
runs per (node, row) on that row's values alone, the others −∞: the norm
kernels' work is per row with paths, so a token's paths cost one row, not T. Host
reads: one per element the enumeration reaches, one per element expanded, and
one per step to list the k paths' links (in lockstep). A graph with
hooks is not for this (rules run outside a walk do not run them): paths.py
takes its k best from a kmax+paths walk.
"""
from __future__ import annotations

import heapq
import math

import torch

from . import _C

_ROOT = ("root",)  # the virtual sink past the output elements: one path, of value 0 (log 1)


class _Element:
    __slots__ = ("node", "slot", "flat", "shape", "best", "paths", "heap", "exhausted")

    def __init__(self, node, slot, flat, shape):
        self.node, self.slot, self.flat, self.shape = node, slot, flat, shape
        self.best = -math.inf
        # kbest: (value, producer, edge, successor key, successor's path index) — producer None: the root
        self.paths = []
        self.heap = None  # candidates (−key, unresolved, order, c, producer, edge, successor, i); None: not built
        self.exhausted = False


class KBest:
    """The lazy enumeration over one recorded viterbi provenance walk (paths._Tracer's records)."""

    def __init__(self, tracer, k: int, seeds):
        self.tracer, self.k = tracer, k
        self.seeds = [s.reshape(-1) for s in seeds]  # each root's seed (viterbi: log|grad_output|)
        self.kmax = _C.make_provenance("kmax", k)
        self.elements = {_ROOT: _Element(None, None, None, ())}
        root = self.elements[_ROOT]
        root.best, root.paths, root.exhausted = 0.0, [(0.0, None, None, None, None)], True
        self.lists = {}  # (node key, edge, row or None) → the node's kmax(k)+paths value along that edge, (2k, numel)
        self.order = 0

    # ---- elements ------------------------------------------------------------------------------------------

    def element(self, key):
        """The element (node key, slot, flat), with its best path read from the record."""
        found = self.elements.get(key)
        return found if found is not None else self.read_elements([key])[0]

    def read_elements(self, keys):
        """The elements of `keys`; those not yet known read from their records in one host transfer."""
        missing = [key for key in dict.fromkeys(keys) if key not in self.elements]
        E = self.tracer.E
        picked = []
        for node_key, slot, flat in missing:
            record = self.tracer.records.get((node_key, slot))
            if record is None:
                raise RuntimeError("torch_semiring: an element on a path has no recorded value")
            picked.append(torch.stack((record[1][0, flat], record[1][E, flat])))
        for (node_key, slot, flat), (score, origin) in zip(missing, torch.stack(picked).tolist() if picked else []):
            node, _, shape, contributors, n = self.tracer.records[(node_key, slot)]
            e = self.elements[(node_key, slot, flat)] = _Element(node, slot, flat, shape)
            if origin < 0 or not math.isfinite(score):
                e.exhausted = True  # no path from here
                continue
            e.best = score
            producer, edge = contributors[int(origin) % n]
            if producer is None:
                e.paths.append((score, None, edge, _ROOT, 0))
            else:
                next_slot, next_flat = self.tracer._locate(producer, int(origin) // n // E)
                e.paths.append((score, producer, edge, (producer.key, next_slot, next_flat), 0))
        return [self.elements[key] for key in keys]

    def _along(self, producer, edge, flat):
        """producer's kmax(k)+paths rule along `edge` (for the input element `flat`), its incoming values the
        best(y) of its outputs. A rule with independent rows (producer.row_length: layer and RMS norm) runs on
        the values of flat's row alone, the other rows holding no path (−∞): one row's candidates, not all."""
        rows = producer.row_length if edge == 0 else 0
        row = flat // rows if rows else None
        key = (producer.key, edge, row)
        if key not in self.lists:
            outputs = producer.outputs
            total = sum(math.prod(shape) for shape, _, _ in outputs)
            values, offset = [], 0
            for slot, (shape, _, _) in enumerate(outputs):
                record = self.tracer.records.get((producer.key, slot))
                if record is not None:
                    best = record[1][0]
                    digits = {torch.float64: 53, torch.float32: 24}.get(best.dtype, 8)
                    if (total + 1) * self.k >= 2.0 ** digits:  # ids = element · k + entry, exact in the values
                        raise ValueError(f"torch_semiring: path ids up to {(total + 1) * self.k} do not fit exactly "
                                         f"in {best.dtype} values; run the model in float64 (model.double()) to "
                                         "extract paths")
                    # entry 0 the best value, its id (offset + element)·k (the ids kmax's with_origin gives);
                    # the other entries no path (−∞, id −1)
                    lists = best.new_full((2 * self.k, best.numel()), -math.inf)
                    lists[0] = best
                    lists[self.k + 1:] = -1
                    torch.arange(offset, offset + best.numel(), out=lists[self.k]).mul_(self.k)
                    if row is not None and slot == 0:  # only this row's outputs lead anywhere
                        outside = torch.ones(best.numel(), dtype=torch.bool, device=best.device)
                        outside[row * rows:(row + 1) * rows] = False
                        lists[0].masked_fill_(outside, -math.inf)
                        lists[self.k].masked_fill_(outside, -1)
                    values.append(lists.view(2 * self.k, *shape))
                else:
                    values.append(None)
                offset += math.prod(shape)
            wanted = [j == edge for j in range(edge + 1)]
            value = _C.run_node_rule(self.kmax, producer, values, wanted)[edge]
            self.lists[key] = None if value is None else value.reshape(2 * self.k, -1)
        return self.lists[key]

    def _expand(self, e: _Element):
        """v's candidates: its k best edges (e, 0) but the tree's, and the tree's (e*, 1), bounded by best(v)."""
        _, _, _, contributors, _ = self.tracer.records[(e.node.key, e.slot)]
        k = self.k
        columns, owners = [], []
        for producer, edge in contributors:
            if producer is None:
                seed = self.seeds[edge][e.flat].to(torch.float64)
                columns.append(torch.cat((seed.view(1), seed.new_full((k - 1,), -math.inf),
                                          seed.new_zeros(1), seed.new_full((k - 1,), -1.0))))
            else:
                lists = self._along(producer, edge, e.flat)
                if lists is None:
                    continue
                columns.append(lists[:, e.flat].to(torch.float64))
            owners.append((producer, edge))
        e.heap = []
        tree = e.paths[0]
        tree_taken = False
        for (producer, edge), column in zip(owners, torch.stack(columns).tolist() if columns else []):
            for score, ident in zip(column[:k], column[k:]):
                if not math.isfinite(score) or ident < 0:
                    continue
                if producer is None:
                    successor = _ROOT
                else:
                    next_slot, next_flat = self.tracer._locate(producer, int(ident) // k)
                    successor = (producer.key, next_slot, next_flat)
                if not tree_taken and edge == tree[2] and successor == tree[3] and \
                        (producer is None) == (tree[1] is None) and (producer is None or producer.key == tree[1].key):
                    tree_taken = True  # the tree's own edge: its (e*, 0) is paths[0]
                    continue
                self._push(e, score, False, score, producer, edge, successor, 0)
        if tree[3] is not _ROOT:
            self._push(e, e.best, True, e.best, tree[1], tree[2], tree[3], 1)

    def _push(self, e, key, unresolved, c, producer, edge, successor, i):
        self.order += 1
        heapq.heappush(e.heap, (-key, unresolved, self.order, c, producer, edge, successor, i))

    def _need(self, key, j: int) -> None:
        """Makes kbest(key) hold j + 1 paths, or all there are (explicit stack: paths can be long)."""
        stack = [(key, j)]
        while stack:
            key, j = stack[-1]
            e = self.element(key)
            if len(e.paths) > j or e.exhausted:
                stack.pop()
                continue
            if e.heap is None:
                self._expand(e)
            if not e.heap:
                e.exhausted = True
                continue
            neg, unresolved, _, c, producer, edge, successor, i = e.heap[0]
            if not unresolved:
                heapq.heappop(e.heap)
                e.paths.append((-neg, producer, edge, successor, i))
                if successor is not _ROOT:
                    self._push(e, -neg, True, c, producer, edge, successor, i + 1)
                continue
            y = self.element(successor)
            if len(y.paths) > i:
                heapq.heappop(e.heap)
                self._push(e, c - y.best + y.paths[i][0], False, c, producer, edge, successor, i)
            elif y.exhausted:
                heapq.heappop(e.heap)
            else:
                stack.append((successor, i))

    # ---- the k best overall ----------------------------------------------------------------------------------

    def best_paths(self, starts):
        """The k best paths from the input elements `starts` [(input, node, slot, flat)], best first:
        [(value, input, chain)] with chain as paths._Tracer.trace_all gives it."""
        source = _Element(None, None, None, ())
        source.heap = []
        keys = []
        for i, node, slot, flat in starts:
            node = node if isinstance(node, _C.NodeRef) else _C.NodeRef(node)
            keys.append((node.key, slot, flat))
        for (i, *_), key, x in zip(starts, keys, self.read_elements(keys)):
            if x.paths:
                self._push(source, x.best, False, x.best, None, i, key, 0)
        self.elements["source"] = source
        self._need("source", self.k - 1)
        # The paths' links, all paths in lockstep: one read per step for the elements not yet known.
        walks = [[key, index, []] for _, _, _, key, index in source.paths]
        active = list(walks)
        while active:
            for walk, e in zip(active, self.read_elements([walk[0] for walk in active])):
                score, producer, edge, successor, next_index = e.paths[walk[1]]
                link = (e.node, e.slot, e.flat, walk[1], score, e.shape)
                if producer is not None:
                    link += ((producer, edge, successor[1], successor[2]),)
                walk[2].append(link)
                walk[0], walk[1] = successor, next_index
            active = [walk for walk in active if walk[0] is not _ROOT]
        return [(value, i, walk[2]) for (value, _, i, _, _), walk in zip(source.paths, walks)]
