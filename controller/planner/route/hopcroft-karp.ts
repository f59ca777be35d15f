import { checkGraph, maxDegree, type BipartiteMultigraph, type EdgeColouring } from "./edge-colouring.ts";

/** Each left vertex's edges in CSR form: vertex u's are `adjacency[start[u]..start[u + 1])`. */
function leftAdjacency(from: ArrayLike<number>, side: number): { start: Int32Array; adjacency: Int32Array } {
  const start = new Int32Array(side + 1);
  for (let e = 0; e < from.length; e++) start[from[e]! + 1]!++;
  for (let u = 0; u < side; u++) start[u + 1]! += start[u]!;
  const adjacency = new Int32Array(from.length);
  const fill = start.slice(0, side);
  for (let e = 0; e < from.length; e++) adjacency[fill[from[e]!]!++] = e;
  return { start, adjacency };
}

/**
 * The paper's Perfect-routing colouring (§5.4): pad the graph to a Δ-regular bipartite
 * multigraph, then peel off Δ perfect matchings with Hopcroft–Karp, one colour each. A
 * Δ-regular bipartite multigraph always has a perfect matching and loses one degree per
 * round, so every round succeeds. O(Δ·E·√V); kept as the benchmark baseline and as an
 * independent check on `colourEdges`.
 */
export function colourByRegularMatchings(graph: BipartiteMultigraph): EdgeColouring {
  checkGraph(graph);
  const delta = maxDegree(graph);
  const real = graph.from.length;
  const colours = new Int32Array(real).fill(-1);
  if (delta === 0) return { colours, count: 0 };

  const { from, to, side } = padToRegular(graph, delta);
  const edges = from.length;
  const { start, adjacency } = leftAdjacency(from, side);

  const alive = new Uint8Array(edges).fill(1);
  const matchLeft = new Int32Array(side);
  const matchRight = new Int32Array(side);
  const layer = new Int32Array(side);
  const cursor = new Int32Array(side);
  const queue = new Int32Array(side);
  const INF = 0x7fffffff;

  // Layers free left vertices by shortest alternating distance; true when an augmenting path exists.
  const bfs = (): boolean => {
    let head = 0;
    let tail = 0;
    for (let u = 0; u < side; u++) {
      if (matchLeft[u] === -1) {
        layer[u] = 0;
        queue[tail++] = u;
      } else layer[u] = INF;
    }
    let found = false;
    while (head < tail) {
      const u = queue[head++]!;
      for (let i = start[u]!; i < start[u + 1]!; i++) {
        const e = adjacency[i]!;
        if (!alive[e]) continue;
        const m = matchRight[to[e]!]!;
        if (m === -1) found = true;
        else {
          const w = from[m]!;
          if (layer[w] === INF) {
            layer[w] = layer[u]! + 1;
            queue[tail++] = w;
          }
        }
      }
    }
    return found;
  };

  const augment = (u: number): boolean => {
    for (; cursor[u]! < start[u + 1]!; cursor[u]!++) {
      const e = adjacency[cursor[u]!]!;
      if (!alive[e]) continue;
      const v = to[e]!;
      const m = matchRight[v]!;
      if (m === -1 || (layer[from[m]!] === layer[u]! + 1 && augment(from[m]!))) {
        matchLeft[u] = e;
        matchRight[v] = e;
        cursor[u]!++;
        return true;
      }
    }
    layer[u] = INF;
    return false;
  };

  for (let colour = 0; colour < delta; colour++) {
    matchLeft.fill(-1);
    matchRight.fill(-1);
    let matched = 0;
    while (bfs()) {
      cursor.set(start.subarray(0, side));
      for (let u = 0; u < side; u++) if (matchLeft[u] === -1 && augment(u)) matched++;
    }
    if (matched !== side) throw new Error(`round ${colour}: no perfect matching in a regular graph (${matched}/${side}); padding is wrong`);
    for (let u = 0; u < side; u++) {
      const e = matchLeft[u]!;
      alive[e] = 0;
      if (e < real) colours[e] = colour;
    }
  }
  return { colours, count: delta };
}

/**
 * Both sides get `max(left, right)` vertices; dummy edges join vertices short of Δ, greedily,
 * so every vertex ends with degree exactly Δ. Real edges keep their indices.
 */
function padToRegular(graph: BipartiteMultigraph, delta: number) {
  const side = Math.max(graph.left, graph.right);
  const deficitLeft = new Int32Array(side).fill(delta);
  const deficitRight = new Int32Array(side).fill(delta);
  const from: number[] = [];
  const to: number[] = [];
  for (let e = 0; e < graph.from.length; e++) {
    const u = graph.from[e] as number;
    const v = graph.to[e] as number;
    from.push(u);
    to.push(v);
    deficitLeft[u]!--;
    deficitRight[v]!--;
  }
  let v = 0;
  for (let u = 0; u < side; u++) {
    while (deficitLeft[u]! > 0) {
      while (deficitRight[v] === 0) v++;
      const n = Math.min(deficitLeft[u]!, deficitRight[v]!);
      for (let i = 0; i < n; i++) {
        from.push(u);
        to.push(v);
      }
      deficitLeft[u]! -= n;
      deficitRight[v]! -= n;
    }
  }
  return { from: Int32Array.from(from), to: Int32Array.from(to), side };
}
